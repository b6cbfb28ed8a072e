"""The simulator fitted to the real engine against the real engine's own runs (docs/real-engine.md).

    python scripts/engine/compare_fit.py FIT_JSON RUNS_DIR

For every live ``run.json`` under RUNS_DIR (scripts/engine/collapse-table.sh), runs ``simulator run`` with
the same scenario, control, seed, minutes, control minute and settings (so the same arrival trace), plus
the fit's settings (``--fit``), judges both with ``core.runs.judge_run`` over the live run's window, and
prints a Markdown table: end R_t and turns/s side by side, collapsed and recovered side by side.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.runs import judge_run  # noqa: E402
from simulator.fit import fit_overrides  # noqa: E402
from simulator.offline import run_scenario  # noqa: E402


def verdict(series: dict, control_start_min: float, minutes: float, window_min: float) -> dict:
    return judge_run(
        series["prompt_tokens"],
        series["cached_tokens"],
        series["turns"],
        series["sessions_in_system"],
        control_start_min=control_start_min,
        minutes=minutes,
        window_min=window_min,
    ).as_dict()


def mean_turns_per_s(series: dict, lo_s: float, hi_s: float) -> float:
    turns = series["turns"][int(lo_s) : int(hi_s)]
    return sum(turns) / max(1.0, hi_s - lo_s)


def main(fit_path: Path, root: Path) -> int:
    fit = fit_overrides(fit_path)
    print(
        "| seed | scenario | control | real R_t end / sim | real turns/s (min 1-end) / sim | real collapsed / sim "
        "| real recovered / sim | agree |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for path in sorted(root.glob("**/run.json")):
        live = json.loads(path.read_text())
        minutes = live["minutes"]
        start = live["config"]["control"]["control_start_min"]
        window = live["summary"].get("judge_window_min", 1.0)
        overrides = {**live.get("overrides", {}), **fit, "control_start_min": str(start)}
        sim = run_scenario(live["scenario"], live["control"], live["seed"], minutes, overrides)
        lv = verdict(live["series"], start, minutes, window)
        sv = verdict(sim["series"], start, minutes, window)
        lt, st = (mean_turns_per_s(s, 60, minutes * 60) for s in (live["series"], sim["series"]))
        if live["scenario"] == "agent-steady":
            ok = (
                lv["end_hit_ratio"] is not None
                and sv["end_hit_ratio"] is not None
                and abs(lv["end_hit_ratio"] - sv["end_hit_ratio"]) <= 0.1
                and abs(st - lt) <= 0.2 * lt
            )
        elif live["control"] == "off":
            ok = lv["collapsed"] == sv["collapsed"]
        else:
            ok = lv["recovered"] == sv["recovered"]
        rows.append((live["seed"], live["scenario"], live["control"]))
        print(
            f"| {live['seed']} | {live['scenario']} | {live['control']} | {lv['end_hit_ratio']} / "
            f"{sv['end_hit_ratio']} | {lt:.3f} / {st:.3f} | {lv['collapsed']} / {sv['collapsed']} | "
            f"{lv['recovered']} / {sv['recovered']} | {'yes' if ok else 'NO'} |"
        )
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
