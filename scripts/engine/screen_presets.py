"""Screen candidate real-engine presets offline, with the simulator fitted to the engine (docs/real-engine.md).

    python scripts/engine/screen_presets.py FIT_JSON [--seeds 0-7] [--minutes 6] [--control-start-min 3] \
        NAME:key=value,key=value ...

Each candidate is the ``cpu-tiny`` preset plus its ``key=value`` settings (the simulator's ``--set``
keys; ``burst_sessions=N`` is shorthand for ``burst_rate = N / (burst_minutes * 60)``), run with the
fit's cost model (``simulator run --fit``) for agent-steady (off), agent-burst (off) and agent-burst
(budgeter-park), judged with 1-minute windows as the live runs are. Prints per candidate how many
seeds meet each target of issue 12: steady never degraded; burst + off collapsed at the control
minute and degraded at the end; budgeter-park recovered within 3 minutes (of the collapsed ones).
"""

from __future__ import annotations

import argparse
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.runs import judge_run  # noqa: E402
from simulator.fit import fit_overrides, preset_overrides  # noqa: E402
from simulator.offline import run_scenario  # noqa: E402

ROWS = (("agent-steady", "off"), ("agent-burst", "off"), ("agent-burst", "budgeter-park"))


def settings(scenario: str, base: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    out = {**preset_overrides("cpu-tiny", scenario), **base}
    extra = dict(extra)
    sessions = extra.pop("burst_sessions", None)
    if scenario == "agent-burst" and sessions is not None:
        minutes = float(extra.get("burst_minutes", out.get("burst_minutes", "0.5")))
        out["burst_rate"] = f"{float(sessions) / (minutes * 60):.6g}"
    if scenario == "agent-steady":
        extra.pop("burst_rate", None)
    return {**out, **extra}


def one(job: tuple[str, dict[str, str], dict[str, str], str, str, int, float, float]) -> dict[str, Any]:
    name, fit, extra, scenario, control, seed, minutes, start = job
    over = {**settings(scenario, fit, extra), "control_start_min": str(start)}
    r = run_scenario(scenario, control, seed, minutes, over)
    s = r["series"]
    v = judge_run(
        s["prompt_tokens"],
        s["cached_tokens"],
        s["turns"],
        s["sessions_in_system"],
        control_start_min=start,
        minutes=minutes,
        window_min=1.0,
    ).as_dict()
    return {"name": name, "scenario": scenario, "control": control, "seed": seed, **v}


def parse_candidate(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    pairs = [p for p in rest.split(",") if p]
    try:
        return name, dict(p.split("=", 1) for p in pairs)  # type: ignore[misc]
    except ValueError:
        raise SystemExit(f"error: candidate {text!r}: expected NAME:key=value,key=value") from None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("fit", type=Path)
    p.add_argument("candidates", nargs="+")
    p.add_argument("--seeds", default="0-7")
    p.add_argument("--minutes", type=float, default=6.0)
    p.add_argument("--control-start-min", type=float, default=3.0)
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    fit = fit_overrides(args.fit)
    cands = [parse_candidate(c) for c in args.candidates]
    jobs = [
        (name, fit, extra, sc, ctl, seed, args.minutes, args.control_start_min)
        for name, extra in cands
        for sc, ctl in ROWS
        for seed in seeds
    ]
    with Pool(args.jobs) as pool:
        results = pool.map(one, jobs)
    n = len(seeds)
    print(
        f"| candidate | steady healthy (of {n}) | burst+off collapsed & at end | park recovered ≤3 min "
        "(of collapsed) | seeds failing |"
    )
    print("|---|---|---|---|---|")
    for name, extra in cands:
        mine = [r for r in results if r["name"] == name]
        steady = [r for r in mine if r["scenario"] == "agent-steady"]
        off = [r for r in mine if r["scenario"] == "agent-burst" and r["control"] == "off"]
        park = [r for r in mine if r["control"] == "budgeter-park"]
        ok_steady = [r["seed"] for r in steady if not r["degraded_at"]]
        ok_off = [r["seed"] for r in off if r["collapsed"] and r["degraded_at_end"]]
        collapsed = [r for r in park if r["collapsed"]]
        ok_park = [r["seed"] for r in collapsed if r["recovered"] and (r["minutes_to_recover"] or 99) <= 3]
        bad = {
            "steady": sorted(set(seeds) - set(ok_steady)),
            "off": sorted(set(seeds) - set(ok_off)),
            "park": sorted({r["seed"] for r in collapsed} - set(ok_park)),
        }
        print(
            f"| {name} ({','.join(f'{k}={v}' for k, v in extra.items())}) | {len(ok_steady)} | {len(ok_off)} | "
            f"{len(ok_park)} / {len(collapsed)} | {bad} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
