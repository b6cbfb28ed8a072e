"""``python -m simulator replay FILE --control MODE --at T`` (issue 16 item 4): "what would have happened had
we switched to MODE at T", from an incident bundle (``python -m collectors export-incident``).

Inputs come from the bundle only (never the simulator's own settings), through `simulator.forecast`:

- the engine: its KV pool (the newest ``pool_tokens`` sample at or before T), its KV block size (the
  newest ``block_size`` sample, else `core.attribution.DEFAULT_BLOCK_SIZE`) and a cost model
  estimated from its recorded latency signals (`simulator.forecast_cost.cost_from_latencies`), and the turn
  latency outside the engine's clock (`simulator.forecast.turn_overhead_basis`);
- the sessions in the system at T: those with a recorded turn before T (within ``IDLE_S``) and one
  after it, as admitted sessions with their context (prompt + completion of their last turn before T),
  the turns done, the output budget their client declared (the bundle's ``sessions``) and when they
  arrived (first seen, or their first recorded turn's arrival: admitted then, so the budgeter parks the
  newest first as the sidecar's does);
- the workload: turn sizes, tool gaps and arrivals of the 30 minutes of turns before T
  (`simulator.forecast.shapes_from_turns`), and the output budgets declared by the sessions seen in
  those minutes, which new sessions draw from (a bundle without ``sessions``, written before they
  were exported: the budgeter's default for every session).

It then simulates from T to the bundle's end (or ``--minutes``) with the sidecar's budgeter in MODE
(`simulator.forecast_run.run_forecast`), as many draws as the Budgeter page's preview of that length
(`simulator.forecast_draws`: the median of each field, ``spread`` their range), and judges the median
run like ``simulator run`` (`core.runs.judge_run`, the control starting at minute 0): the same summary
fields (collapsed, recovered, minutes_to_recover, end_hit_ratio, degraded_at, end_turns_per_s, ...)
plus the forecast's (r_t, parked, p95 latency, draws), and what the bundle recorded after T
(``recorded_r_t``) to compare with.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from collectors.incident import IncidentError, parse_time, read_bundle
from core.attribution import DEFAULT_BLOCK_SIZE
from core.budgeter import CONTROLS, BudgeterConfig
from core.runs import judge_run
from simulator.config import EngineConfig, SimConfigError
from simulator.forecast import (
    WINDOW_S,
    ForecastError,
    ForecastInputs,
    declared_budgets,
    shapes_from_turns,
    start_sessions,
    turn_overhead_basis,
)
from simulator.forecast_cost import as_int, as_num, cost_from_latencies
from simulator.forecast_draws import draws_for, run_draws

IDLE_S = 600.0  # the sidecar's default idle timeout: a session quiet longer than this had ended


def _signal_rows(doc: Mapping[str, Any], role: str, until: float) -> list[dict[str, Any]]:
    """Dicts of the ``role`` targets' signals at or before ``until``, one per time and engine label (as the
    Budgeter page reads them: a multi-rank engine's ranks stay apart, and the estimates combine them)."""
    urls = {t["url"] for t in doc["targets"] if t["role"] == role}
    by_ts: dict[tuple[float, str], dict[str, Any]] = {}
    for s in doc["series"]:
        if s["target"] not in urls:
            continue
        for ts, value in zip(s["ts"], s["value"], strict=True):
            if ts <= until:
                by_ts.setdefault((ts, s.get("engine") or ""), {"ts": ts})[s["signal"]] = value
    return [by_ts[t] for t in sorted(by_ts)]


def replay_inputs(doc: Mapping[str, Any], at: float, config: BudgeterConfig) -> ForecastInputs:
    side = _signal_rows(doc, "sidecar", at)
    eng = _signal_rows(doc, "engine", at)
    pools = [r["pool_tokens"] for r in side + eng if r.get("pool_tokens")]
    if not pools:
        raise ForecastError(
            "the bundle has no pool_tokens sample before --at: the engine's KV pool is unknown"
        )
    blocks = [r["block_size"] for r in eng if r.get("block_size", 0) >= 1]  # the engine's, as recorded
    turns = [dict(t, session=t.get("session_id")) for t in doc.get("turns", []) if t.get("outcome") == "ok"]
    before = [t for t in turns if t["ts"] <= at]
    after_ids = {t["session_id"] for t in turns if t["ts"] > at}
    last: dict[str, dict[str, Any]] = {}
    count: dict[str, int] = {}
    began: dict[str, float] = {}  # its first recorded turn's arrival at the sidecar
    for t in before:
        if t["session_id"] is not None:
            last[t["session_id"]] = t
            count[t["session_id"]] = count.get(t["session_id"], 0) + 1
            arrival = t["ts"] - (as_num(t.get("latency_s")) or 0.0) - (as_num(t.get("held_s")) or 0.0)
            began[t["session_id"]] = min(arrival, began.get(t["session_id"], arrival))
    seen = doc.get("sessions") or []
    budgets = {r["session_id"]: as_int(r.get("output_budget")) for r in seen}
    first_seen = {r["session_id"]: as_num(r.get("first_seen_ts")) for r in seen}
    rows = [
        {
            "session_id": sid,
            "state": "admitted",
            "turns": count[sid],
            "context_tokens": (t["prompt_tokens"] or 0) + (t["completion_tokens"] or 0),
            "data": {
                "output_budget": budgets.get(sid, 0),
                "last_activity": t["ts"],
                # admitted when it arrived (the replay starts from what the engine served): the
                # budgeter parks the most recently admitted first
                "arrived_at": (arrived := min(began[sid], first_seen.get(sid) or began[sid])),
                "admitted_at": arrived,
            },
        }
        for sid, t in last.items()
        if sid in after_ids and at - t["ts"] <= IDLE_S
    ]
    recent = [
        {"data": r}
        for r in seen
        if r.get("first_seen_ts", at) <= at and r.get("last_seen_ts", at) >= at - WINDOW_S
    ]
    sessions = start_sessions(rows, at)
    shapes = shapes_from_turns(before, at, [r["session_id"] for r in rows])
    if not shapes.extras or not shapes.gaps or not shapes.outputs:
        raise ForecastError(
            f"too few turns before --at in the bundle ({shapes.turns_seen}) to draw turn sizes and "
            "tool gaps from"
        )
    overhead, basis = turn_overhead_basis(before, eng, at)
    return ForecastInputs(
        engine=EngineConfig(
            pool_tokens=int(pools[-1]), block_size=int(blocks[-1]) if blocks else DEFAULT_BLOCK_SIZE
        ),
        cost=cost_from_latencies(eng, pools[-1]),
        cost_source="latencies",
        sessions=sessions,
        shapes=shapes,
        output_budget=config.default_output_budget,
        output_budgets=declared_budgets(recent),
        turn_overhead_s=overhead,
        turn_overhead_from=basis,
    )


def replay(
    doc: Mapping[str, Any], control: str, at: float, minutes: float | None = None, seed: int = 0
) -> dict[str, Any]:
    if not doc["from"] <= at < doc["to"]:
        raise ForecastError(f"--at {at} is outside the bundle's range [{doc['from']}, {doc['to']})")
    config = BudgeterConfig(mode=control)
    minutes = (doc["to"] - at) / 60.0 if minutes is None else minutes
    inputs = replay_inputs(doc, at, config)
    result = run_draws(inputs, config, minutes, seed, draws_for(minutes))
    s = result["series"]
    in_system = [1.0] * len(s["turns"])  # sessions are offered work throughout
    verdict = judge_run(
        s["prompt_tokens"], s["cached_tokens"], s["turns"], in_system, control_start_min=0.0, minutes=minutes
    ).as_dict()
    recorded = [
        t
        for t in doc.get("turns", [])
        if at < t["ts"] <= at + minutes * 60
        and t.get("outcome") == "ok"
        and t.get("cached_tokens") is not None
    ]
    prompt = sum(t["prompt_tokens"] or 0 for t in recorded)
    summary = {
        **verdict,
        **result["summary"],
        "control": control,
        "at": at,
        "engine": doc["engine"],
        "cost_source": inputs.cost_source,
        "turn_overhead_s": round(inputs.turn_overhead_s, 3),
        "turn_overhead_from": inputs.turn_overhead_from,
        "recorded_r_t": round(sum(t["cached_tokens"] for t in recorded) / prompt, 4) if prompt else None,
    }
    return {"summary": summary, "spread": result["spread"], "series": s}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="an incident bundle (python -m collectors export-incident)")
    p.add_argument("--control", required=True, choices=CONTROLS, help="the control mode switched to at --at")
    p.add_argument(
        "--at", required=True, metavar="T", help="when: RFC 3339 or epoch seconds, inside the bundle"
    )
    p.add_argument(
        "--minutes", type=float, default=None, help="how long to simulate (default: to the bundle's end)"
    )
    p.add_argument("--seed", type=int, default=0)


def command(args: argparse.Namespace) -> int:
    try:
        doc = read_bundle(args.file)
        result = replay(doc, args.control, parse_time(args.at, "--at"), args.minutes, args.seed)
    except (IncidentError, ForecastError) as exc:
        raise SimConfigError(str(exc)) from None
    print(json.dumps(result["summary"], sort_keys=True))
    return 0
