"""The offline commands ``run`` and ``table3`` (``compaction`` is in ``simulator.compaction_experiment``).

Each writes JSON (the data), Markdown where there is a table, and PNG plots
(matplotlib, Agg backend). Simulation time is measured inside each run
(``summary.wall_s``), excluding start-up and plotting. Multi-run commands fan
out over the cores with ``multiprocessing`` and show a ``tqdm`` progress bar.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
from collections.abc import Iterable
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from simulator.config import SimConfigError, parse_set_args
from simulator.offline import CONTROLS, SCENARIOS, run_scenario, scenario
from simulator.plots import plot_rag, plot_run, plot_table3

log = logging.getLogger(__name__)

BAND_VARIANTS = {
    "budgeter-park (65/85)": {"low_band": 0.65, "high_band": 0.85},
    "budgeter-park (85/98)": {"low_band": 0.85, "high_band": 0.98},
}


# ------------------------------------------------------------------ helpers
def worker_count(requested: int | None) -> int:
    return max(1, requested or os.cpu_count() or 1)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")


# ------------------------------------------------------------------ run
def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="workload, engine, cost or control setting (repeatable); see docs/simulator.md",
    )
    p.add_argument("--exact", action="store_true", help="exact per-block, per-step engine (the reference)")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, choices=SCENARIOS)
    p.add_argument("--control", default="off", choices=CONTROLS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=90.0)
    p.add_argument("--out", required=True, type=Path)
    add_common(p)


def one_line(result: dict[str, Any]) -> str:
    s = result["summary"]
    if scenario(result["scenario"]).model == "rag":
        return (
            f"{result['scenario']} seed={result['seed']} trigger={s.get('trigger')} R_t={s.get('token_weighted')} "
            f"R_r={s.get('request_weighted')} D={s.get('divergence')} compactions={s.get('compactions')} "
            f"R_t_after_compaction={s.get('token_weighted_after_compaction')} "
            f"relative_input_cost={s.get('relative_input_cost')} wall_s={s.get('wall_s')}"
        )
    return (
        f"{result['scenario']} control={result['control']} seed={result['seed']} minutes={result['minutes']:g} "
        f"collapsed={s['collapsed']} recovered={s['recovered']} minutes_to_recover={s['minutes_to_recover']} "
        f"end_hit_ratio={s['end_hit_ratio']} end_turns_per_s={s['end_turns_per_s']} "
        f"steady_offered_turns_per_s={s['steady_offered_turns_per_s']} "
        f"sessions_in_system={s['end_sessions_in_system']:g} wall_s={s['wall_s']} "
        f"({s.get('sim_minutes_per_wall_s')} sim-min/wall-s, {result['mode']})"
    )


def run_command(args: argparse.Namespace) -> int:
    try:
        overrides = parse_set_args(args.set)
        result = run_scenario(
            args.scenario, args.control, args.seed, args.minutes, overrides, exact=args.exact
        )
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "run.json", result)
    if scenario(args.scenario).model == "rag":
        plot_rag(result, out / "run.png")
    else:
        plot_run(result, out / "run.png")
    print(one_line(result))
    return 0


# ------------------------------------------------------------------ table3
def add_table3_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=12, help="seeds per row")
    p.add_argument("--seed-base", type=int, default=0)
    p.add_argument("--minutes", type=float, default=90.0)
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--pairs-only",
        action="store_true",
        help="only the pairs (agent-steady and agent-burst under off): a cheap calibration sweep",
    )
    add_common(p)


def _table3_job(job: tuple[str, str, str, int, float, dict[str, str], bool]) -> dict[str, Any]:
    row, scenario, control, seed, minutes, overrides, exact = job
    logging.getLogger().setLevel(logging.WARNING)
    result = run_scenario(scenario, control, seed, minutes, overrides, exact=exact)
    s = result["series"]
    keep = {k: s[k] for k in ("t", "token_weighted", "turns_per_s", "sessions_in_system", "parked")}
    return {
        "row": row,
        "scenario": scenario,
        "control": control,
        "seed": seed,
        "summary": result["summary"],
        "series": keep,
        "control_start_min": result["config"]["control"]["control_start_min"],
    }


def table3_jobs(
    runs: int,
    seed_base: int,
    minutes: float,
    overrides: dict[str, str],
    exact: bool,
    pairs_only: bool = False,
) -> list[tuple[str, str, str, int, float, dict[str, str], bool]]:
    jobs = []
    for seed in range(seed_base, seed_base + runs):
        jobs.append(("pair-steady", "agent-steady", "off", seed, minutes, overrides, exact))
        if pairs_only:
            jobs.append(("off", "agent-burst", "off", seed, minutes, overrides, exact))
            continue
        for control in CONTROLS:
            jobs.append((control, "agent-burst", control, seed, minutes, overrides, exact))
        for row, bands in BAND_VARIANTS.items():
            ov = {**overrides, **{k: str(v) for k, v in bands.items()}}
            jobs.append((row, "agent-burst", "budgeter-park", seed, minutes, ov, exact))
    return jobs


def summarize_table3(
    results: Iterable[dict[str, Any]], runs: int, seed_base: int, minutes: float
) -> dict[str, Any]:
    by_row: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_row.setdefault(r["row"], []).append(r)
    for rows in by_row.values():
        rows.sort(key=lambda r: r["seed"])
    steady = {r["seed"]: r["summary"]["degraded_at_end"] for r in by_row.get("pair-steady", [])}
    burst = {r["seed"]: r["summary"]["degraded_at_end"] for r in by_row.get("off", [])}
    seeds = sorted(set(steady) & set(burst))
    data: dict[str, Any] = {
        "pairs": len(seeds),
        "burst_only_degraded": sum(1 for s in seeds if burst[s] and not steady[s]),
        "steady_only_degraded": sum(1 for s in seeds if steady[s] and not burst[s]),
        "both_degraded": sum(1 for s in seeds if steady[s] and burst[s]),
        "burst_degraded": sum(1 for s in seeds if burst[s]),
        "steady_degraded": sum(1 for s in seeds if steady[s]),
        "runs": runs,
        "seed_base": seed_base,
        "minutes": minutes,
    }
    degraded_end = [r for r in by_row.get("off", []) if r["summary"]["degraded_at_end"]]
    if degraded_end:
        data["degraded_at_end_stats"] = {
            "token_weighted_max": max(r["summary"]["end_hit_ratio"] or 0.0 for r in degraded_end),
            "turns_per_s_max": max(r["summary"]["end_turns_per_s"] for r in degraded_end),
            "turns_per_s_min": min(r["summary"]["end_turns_per_s"] for r in degraded_end),
            "turns_per_s_median": statistics.median(r["summary"]["end_turns_per_s"] for r in degraded_end),
            "offered_turns_per_s": degraded_end[0]["summary"]["offered_turns_per_s"],
            "steady_offered_turns_per_s": degraded_end[0]["summary"]["steady_offered_turns_per_s"],
            "sessions_slope_per_min_min": min(r["summary"]["sessions_slope_per_min"] for r in degraded_end),
        }
    for row in [*CONTROLS, *BAND_VARIANTS]:
        rows = by_row.get(row, [])
        collapsed = [r for r in rows if r["summary"]["collapsed"]]
        data[row] = {
            "collapsed_runs": len(collapsed),
            "recovered_runs": sum(1 for r in collapsed if r["summary"]["recovered"]),
            "minutes_to_recover": [r["summary"]["minutes_to_recover"] for r in collapsed],
            "end_hit_ratio": [r["summary"]["end_hit_ratio"] for r in collapsed],
            "collapsed_seeds": [r["seed"] for r in collapsed],
            "runs": len(rows),
        }
    data["wall_s_median"] = statistics.median([r["summary"]["wall_s"] for rs in by_row.values() for r in rs])
    return data


def _fmt_range(values: list[float]) -> str:
    if not values:
        return "—"
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo}–{hi}"


def table3_markdown(data: dict[str, Any]) -> str:
    lines = [
        f"Pairs (seeds {data['seed_base']}..{data['seed_base'] + data['runs'] - 1}, {data['minutes']:g} simulated "
        "minutes, control `off`, judged degraded at the end of the run):",
        "",
        "| pairs | burst only degraded | steady only degraded | both degraded | neither |",
        "|---|---|---|---|---|",
    ]
    neither = (
        data["pairs"] - data["burst_only_degraded"] - data["steady_only_degraded"] - data["both_degraded"]
    )
    lines.append(
        f"| {data['pairs']} | {data['burst_only_degraded']} | {data['steady_only_degraded']} | "
        f"{data['both_degraded']} | {neither} |"
    )
    st = data.get("degraded_at_end_stats")
    if st:
        lines += [
            "",
            f"Degraded burst runs at minute {data['minutes']:g}: token_weighted <= "
            f"{st['token_weighted_max']:.3f}, turns/s {st['turns_per_s_min']:.2f}–{st['turns_per_s_max']:.2f} "
            f"(offered {st['offered_turns_per_s']:g}, {st['steady_offered_turns_per_s']:g} without the burst), "
            f"sessions in system slope >= {st['sessions_slope_per_min_min']:+.2f}/min.",
        ]
    if data.get("pairs_only"):
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "Controls on `agent-burst`, switched on at minute 20 (only runs collapsed at minute 20 count):",
        "",
        "| control | collapsed runs recovered | time to recover (min) | hit ratio at end |",
        "|---|---|---|---|",
    ]
    for row in [*CONTROLS, *BAND_VARIANTS]:
        d = data[row]
        times = [m for m in d["minutes_to_recover"] if m is not None]
        t = f"median {statistics.median(times):g} (max {max(times)})" if times else "—"
        hits = [h for h in d["end_hit_ratio"] if h is not None]
        lines.append(f"| {row} | {d['recovered_runs']}/{d['collapsed_runs']} | {t} | {_fmt_range(hits)} |")
    return "\n".join(lines) + "\n"


def table3_command(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    try:
        overrides = parse_set_args(args.set)
        # validate once in the parent so a bad --set fails fast with one message
        run_scenario("agent-steady", "off", 0, 0.05, overrides)
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    jobs = table3_jobs(args.runs, args.seed_base, args.minutes, overrides, args.exact, args.pairs_only)
    results: list[dict[str, Any]] = []
    with Pool(worker_count(args.jobs)) as pool:
        for r in tqdm(
            pool.imap_unordered(_table3_job, jobs), total=len(jobs), desc="table3 runs", unit="run"
        ):
            results.append(r)
    data = summarize_table3(results, args.runs, args.seed_base, args.minutes)
    data["pairs_only"] = args.pairs_only
    data["commands"] = {"table3": " ".join(["python -m simulator", *sys.argv[1:]])}
    data["run_summaries"] = sorted(
        (
            {
                "row": r["row"],
                "scenario": r["scenario"],
                "seed": r["seed"],
                **{k: v for k, v in r["summary"].items() if k != "degraded_at"},
            }
            for r in results
        ),
        key=lambda d: (d["row"], d["seed"]),
    )
    _write_json(out / "table3.json", data)
    md = table3_markdown(data)
    (out / "table3.md").write_text(md)
    if not args.pairs_only:
        plot_table3(results, [*CONTROLS, *BAND_VARIANTS], out / "table3.png")
    print(md)
    return 0
