"""``python -m simulator attribution-check``: `core.attribution` against the simulator's ground truth.

One seeded offline run with a `simulator.truth.Watch` gives two things per finished request:

* the turn trace row the sidecar would record (``ts`` = finish time, session, subtree, prompt, cached
  and completion tokens, ``held_s``, ``parked_s``, ``latency_s``, outcome), plus what the collectors
  would know besides: the granted compactions (prefix changes) and the ``demand / pool`` samples,
  one per simulated second (the collectors' default scrape interval), as pressure intervals;
* the ground truth: why each of its missing prompt tokens was missing (``simulator.truth``).

`core.attribution.attribute_all` runs on the trace, exactly as ``db.queries.miss_attribution`` runs
it on stored turns, and the two splits are compared cause by cause. Within a turn both are token
counts per cause: the confusion matrix takes ``min(truth, attribution)`` of each cause on its
diagonal and spreads the rest of each truth cause over the attribution causes left over, in
proportion. *Agreement* of cause C: the share of ground-truth tokens of C that attribution also put
in C; *precision*: the share of the tokens attribution put in C that the ground truth has in C.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from core.attribution import CAUSES, Events, Turn, above_pool_intervals, attribute_all, totals
from simulator.config import parse_set_args
from simulator.offline import SCENARIOS, run_scenario
from simulator.truth import Watch

log = logging.getLogger(__name__)

REPORT_NAME = "attribution-check.json"


def trace_turns(trace: list[dict[str, Any]]) -> list[Turn]:
    """The trace rows as `core.attribution.Turn` (one sidecar), as ``db.queries.turns.as_turn`` does."""
    return [
        Turn(
            ts=row["ts"],
            prompt_tokens=row["prompt_tokens"],
            cached_tokens=row["cached_tokens"],
            completion_tokens=row["completion_tokens"],
            session=row["session"],
            subtree=row["subtree"],
            sidecar="sim",
            parked_s=row["parked_s"],
            latency_s=row["latency_s"],
        )
        for row in trace
    ]


def confusion(truth: dict[str, int], attributed: dict[str, int]) -> dict[str, dict[str, float]]:
    """One turn's tokens from truth cause (rows) to attributed cause (columns); see the module doc."""
    out: dict[str, dict[str, float]] = {}
    left_t = dict(truth)
    left_a = dict(attributed)
    for cause in CAUSES:
        both = min(left_t.get(cause, 0), left_a.get(cause, 0))
        if both:
            out.setdefault(cause, {})[cause] = float(both)
            left_t[cause] -= both
            left_a[cause] -= both
    rest = sum(left_a.values())
    for cause, n in left_t.items():
        if n <= 0 or rest <= 0:
            continue
        row = out.setdefault(cause, {})
        for other, m in left_a.items():
            if m > 0:
                row[other] = row.get(other, 0.0) + n * m / rest
    return out


def compare(trace: list[dict[str, Any]], events: Events, block_size: int) -> dict[str, Any]:
    """Tokens per cause by each, per-cause agreement and the confusion matrix (tokens)."""
    order = sorted(range(len(trace)), key=lambda i: trace[i]["ts"])
    rows = [trace[i] for i in order]
    parts = attribute_all(trace_turns(rows), events, block_size)
    matrix = {c: dict.fromkeys(CAUSES, 0.0) for c in CAUSES}
    detail: dict[str, int] = {}
    for row, attributed in zip(rows, parts, strict=True):
        for cause, cols in confusion(row["truth"], attributed).items():
            for other, n in cols.items():
                matrix[cause][other] += n
        for name, n in row["truth_detail"].items():
            detail[name] = detail.get(name, 0) + n
    truth_totals = totals(row["truth"] for row in rows)
    attributed_totals = totals(parts)
    agreement = {c: (round(matrix[c][c] / truth_totals[c], 4) if truth_totals[c] else None) for c in CAUSES}
    precision = {
        c: (round(matrix[c][c] / attributed_totals[c], 4) if attributed_totals[c] else None) for c in CAUSES
    }
    uncached = sum(truth_totals.values())
    return {
        "turns": len(rows),
        "prompt_tokens": sum(row["prompt_tokens"] for row in rows),
        "uncached_tokens": uncached,
        "truth": truth_totals,
        "attribution": attributed_totals,
        "agreement": agreement,
        "precision": precision,
        "overall_agreement": round(sum(matrix[c][c] for c in CAUSES) / uncached, 4) if uncached else None,
        "confusion": {c: {o: round(n) for o, n in cols.items() if n >= 0.5} for c, cols in matrix.items()},
        "truth_detail": detail,
    }


def check(
    scenario: str,
    control: str,
    seed: int,
    minutes: float,
    overrides: dict[str, Any] | None = None,
    exact: bool = False,
) -> dict[str, Any]:
    """One seeded run, its trace attributed and compared with the ground truth (the JSON report)."""
    watch = Watch()
    result = run_scenario(scenario, control, seed, minutes, overrides, exact=exact, watch=watch)
    events = Events(
        prefix_changes={k: sorted(v) for k, v in watch.prefix_changes.items()},
        pressure=above_pool_intervals([watch.samples]),
    )
    report = compare(watch.trace, events, watch.block_size)
    return {
        "scenario": scenario,
        "control": control,
        "seed": seed,
        "minutes": minutes,
        "overrides": dict(overrides or {}),
        "mode": result["mode"],
        "block_size": watch.block_size,
        "evicted_blocks": watch.evicted,
        "pressure_intervals": len(events.pressure),
        "prefix_changes": sum(len(v) for v in events.prefix_changes.values()),
        **report,
    }


def table(report: dict[str, Any]) -> str:
    """The per-cause table (Markdown) of a report."""
    lines = [
        "| cause | truth tokens | attributed tokens | agreement | precision | where the rest of the truth went |",
        "|---|---|---|---|---|---|",
    ]
    for c in CAUSES:
        t, a = report["truth"][c], report["attribution"][c]
        if not t and not a:
            continue
        share, precision = report["agreement"][c], report["precision"][c]
        rest = sorted(((n, o) for o, n in report["confusion"][c].items() if o != c and n), reverse=True)
        lines.append(
            f"| {c} | {t:,} | {a:,} | {'-' if share is None else f'{share:.1%}'} | "
            f"{'-' if precision is None else f'{precision:.1%}'} | "
            + (", ".join(f"{o} {n / t:.1%}" for n, o in rest[:3]) if t else "-")
            + " |"
        )
    overall = report["overall_agreement"]
    lines.append(
        f"\nturns {report['turns']:,}, uncached tokens {report['uncached_tokens']:,}, "
        f"agreement over all tokens {'-' if overall is None else f'{overall:.1%}'}"
    )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, choices=SCENARIOS)
    p.add_argument("--control", default="budgeter-park", help="the budgeter's mode (agent scenarios)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    p.add_argument("--exact", action="store_true", help="the exact per-block pool (slow)")
    p.add_argument("--out", type=Path, required=True, help=f"directory for {REPORT_NAME}")


def command(args: argparse.Namespace) -> int:
    report = check(args.scenario, args.control, args.seed, args.minutes, parse_set_args(args.set), args.exact)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / REPORT_NAME
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(table(report))
    print(f"wrote {path}")
    return 0
