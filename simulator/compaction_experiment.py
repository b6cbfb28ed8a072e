"""The ``compaction`` command: the rag-storm scenario under each compaction trigger, over seeds.

For every seed it runs ``rag-storm`` with the trigger ``none``, ``naive`` (a
request-count job) and ``gate`` (the job asking ``core.compaction``), and writes
``compaction.json`` (per-trigger figures), ``compaction.md`` (the table) and
``compaction.png``. The model is ``simulator.rag``; this module only repeats it
and summarises.
"""

from __future__ import annotations

import argparse
import json
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from simulator.config import SimConfigError, parse_set_args
from simulator.experiments import add_common, worker_count
from simulator.offline import run_scenario
from simulator.plots import plot_compaction


def add_compaction_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=4, help="seeds per trigger")
    p.add_argument("--seed-base", type=int, default=0)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--out", required=True, type=Path)
    add_common(p)


def compaction_command(args: argparse.Namespace) -> int:
    try:
        overrides = parse_set_args(args.set)
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    return compaction_experiment(
        args.runs, args.seed_base, args.minutes, overrides, args.exact, args.out, worker_count(args.jobs)
    )


def _job(job: tuple[str, int, float, dict[str, str], bool]) -> dict[str, Any]:
    trigger, seed, minutes, overrides, exact = job
    res = run_scenario("rag-storm", "off", seed, minutes, {**overrides, "compaction_trigger": trigger}, exact)
    return {
        "trigger": trigger,
        "seed": seed,
        "summary": res["summary"],
        "series": res["series"],
        "config": res["config"],
    }


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(sum(vals) / len(vals), 4) if vals else None


def compaction_experiment(
    runs: int, seed_base: int, minutes: float, overrides: dict[str, str], exact: bool, out: Path, jobs: int
) -> int:
    from tqdm import tqdm

    triggers = ("none", "naive", "gate")
    work = [(t, s, minutes, overrides, exact) for s in range(seed_base, seed_base + runs) for t in triggers]
    results: list[dict[str, Any]] = []
    with Pool(jobs) as pool:
        for res in tqdm(pool.imap_unordered(_job, work), total=len(work), desc="compaction runs", unit="run"):
            results.append(res)
    results.sort(key=lambda r: r["seed"])  # per-seed lists in seed order
    table: dict[str, Any] = {"runs": runs, "seed_base": seed_base, "minutes": minutes}
    for trig in triggers:
        rs = [r for r in results if r["trigger"] == trig]
        sm = [r["summary"] for r in rs]
        table[trig] = {
            "compactions": [s["compactions"] for s in sm],
            "compactions_in_storm": [s["compactions_in_storm"] for s in sm],
            "steady_R_t": _mean([s["steady"]["token_weighted"] for s in sm]),
            "steady_R_r": _mean([s["steady"]["request_weighted"] for s in sm]),
            "steady_cost": _mean([s["steady"]["relative_input_cost"] for s in sm]),
            "storm_R_t": _mean([s["storm"]["token_weighted"] for s in sm]),
            "storm_R_r": _mean([s["storm"]["request_weighted"] for s in sm]),
            "storm_D": _mean([s["storm"]["divergence"] for s in sm]),
            "subtree_storm_R_t": _mean([s["subtree_storm"]["token_weighted"] for s in sm]),
            "subtree_storm_cost": _mean([s["subtree_storm"]["relative_input_cost"] for s in sm]),
            "subtree_after_storm_R_t": _mean([s["subtree_after_storm"]["token_weighted"] for s in sm]),
            "R_t_after_compaction": _mean([s["token_weighted_after_compaction"] for s in sm]),
            "R_t_two_cycles_after_compaction": _mean(
                [s["token_weighted_two_cycles_after_compaction"] for s in sm]
            ),
            "R_t_two_cycles_after_compaction_max": [
                s["token_weighted_two_cycles_after_compaction_max"] for s in sm
            ],
            "R_t_two_cycles_after_each_compaction": [
                s["token_weighted_two_cycles_after_each_compaction"] for s in sm
            ],
            "compaction_cycle_s": _mean([s["compaction_cycle_s"] for s in sm]),
            "subtree_storm_window_R_t_min": [s["subtree_storm_window_R_t_min"] for s in sm],
            "subtree_cost_window_1_after_storm": _mean([s["subtree_cost_window_1_after_storm"] for s in sm]),
            "subtree_cost_window_2_after_storm": _mean([s["subtree_cost_window_2_after_storm"] for s in sm]),
            "wall_s": _mean([s["wall_s"] for s in sm]),
        }
    naive, gate = sum(table["naive"]["compactions"]), sum(table["gate"]["compactions"])
    table["gate_fewer_compactions"] = round(1 - gate / naive, 4) if naive else None
    (out / "compaction.json").write_text(json.dumps(table, indent=1) + "\n")
    md = compaction_markdown(table)
    (out / "compaction.md").write_text(md)
    plot_compaction(results, out / "compaction.png")
    print(md)
    return 0


def compaction_markdown(t: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return "—" if v is None else f"{v:.2f}"

    lines = [
        f"`rag-storm`, {t['runs']} seeds from {t['seed_base']}, {t['minutes']:g} simulated minutes "
        "(means over seeds). Steady = before the storm; storm columns cover the storm window; "
        "subtree = document-set traffic, the traffic compaction rewrites.",
        "",
        "| trigger | compactions (storm) | steady R_t / R_r | storm R_t / R_r / D | subtree R_t in storm | "
        "subtree R_t 15 s after each mid-storm compaction | subtree relative input cost in storm |",
        "|---|---|---|---|---|---|---|",
    ]
    for trig in ("none", "naive", "gate"):
        d = t[trig]
        comp = sum(d["compactions"]) / max(1, len(d["compactions"]))
        comp_storm = sum(d["compactions_in_storm"]) / max(1, len(d["compactions_in_storm"]))
        lines.append(
            f"| {trig} | {comp:.1f} ({comp_storm:.1f}) | {f(d['steady_R_t'])} / {f(d['steady_R_r'])} | "
            f"{f(d['storm_R_t'])} / {f(d['storm_R_r'])} / {f(d['storm_D'])} | {f(d['subtree_storm_R_t'])} | "
            f"{f(d['R_t_after_compaction'])} | {f(d['subtree_storm_cost'])} |"
        )
    lines += [
        "",
        "Subtree traffic around the compactions (R_t token-weighted; cost relative to uncached input; "
        "a window is the reuse window, 60 s):",
        "",
        "| trigger | lowest storm window R_t (per seed) | R_t over two cycles after the mid-storm compactions "
        "(cycle) | ... after the mildest one, per seed (after each <= x needs this <= x) | cost, 1st / 2nd window after the storm |",
        "|---|---|---|---|---|",
    ]
    for trig in ("none", "naive", "gate"):
        d = t[trig]
        lows = ", ".join(f(v) for v in d["subtree_storm_window_R_t_min"])
        worst = ", ".join(f(v) for v in d["R_t_two_cycles_after_compaction_max"])
        cycle = "—" if d["compaction_cycle_s"] is None else f"{d['compaction_cycle_s']:.0f} s"
        lines.append(
            f"| {trig} | {lows} | {f(d['R_t_two_cycles_after_compaction'])} ({cycle}) | {worst} | "
            f"{f(d['subtree_cost_window_1_after_storm'])} / {f(d['subtree_cost_window_2_after_storm'])} |"
        )
    fewer = t.get("gate_fewer_compactions")
    if fewer is not None:
        lines += [
            "",
            f"The gate ran {fewer:.0%} fewer compactions than the request-count trigger over the run.",
        ]
    return "\n".join(lines) + "\n"
