"""The turn trace and why misses happen (issue 16 items 1 and 2): reads of the ``turns`` table and the
attribution of each turn's uncached prompt tokens to a cause (`core.attribution`).

`miss_attribution` walks every sidecar's turns in time order (a session's previous turn may have gone
through another sidecar of the fleet: ``routed-away``), starting `LOOKBACK_S` before the window so the
first turns in it know their session's previous turn, with the facts the turns do not show:

- prefix changes: compaction decisions *granted* per subtree (`db.models.CompactionDecision`);
- demand above the pool: the sidecars' ``demand_fraction`` raw samples above 1, each sample
  standing for the interval until the next one.

Only the turns in ``[start, end)`` of the asked sidecars are counted, per bucket of ``bucket_s`` and
per session. ``recomputed`` is the per-bucket "hits counted for recomputation": the engine's prefix
cache hits (``prefix_cache_hits_per_s`` × bucket) beyond the cached tokens the sidecar saw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from core import signals as sig
from core.attribution import (
    CAUSES,
    MISS_CAUSES,
    Attributor,
    Events,
    Turn,
    above_pool_intervals,
    recomputed_hits,
)
from db.models import CompactionDecision, Sample, Series
from db.models import Turn as TurnRow
from db.queries._common import Conn, id_list, rows, run

LOOKBACK_S = 3600.0
TURN_COLUMNS = (
    "id",
    "target_id",
    "remote_id",
    "ts",
    "session_id",
    "subtree_id",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "held_s",
    "parked_s",
    "latency_s",
    "outcome",
    "model",
)


def turns(
    conn: Conn,
    *,
    target_id: Sequence[int] | int | None = None,
    start_ts: float | None = None,
    end_ts: float | None = None,
    session: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Stored turns in ``[start_ts, end_ts)``, oldest first."""
    stmt = select(*(getattr(TurnRow, c) for c in TURN_COLUMNS))
    ids = id_list(target_id)
    if ids is not None:
        stmt = stmt.where(TurnRow.target_id.in_(ids))
    if start_ts is not None:
        stmt = stmt.where(TurnRow.ts >= start_ts)
    if end_ts is not None:
        stmt = stmt.where(TurnRow.ts < end_ts)
    if session is not None:
        stmt = stmt.where(TurnRow.session_id == session)
    stmt = stmt.order_by(TurnRow.ts, TurnRow.id)
    return run(conn, stmt.limit(limit) if limit is not None else stmt)


def prefix_changes(conn: Conn, start_ts: float, end_ts: float) -> dict[str, list[float]]:
    """Per subtree, the sorted times of granted compactions in ``[start_ts, end_ts)``, fleet-wide."""
    out: dict[str, list[float]] = {}
    for subtree, ts in rows(
        conn,
        select(CompactionDecision.subtree_id, CompactionDecision.ts)
        .where(
            CompactionDecision.ts >= start_ts,
            CompactionDecision.ts < end_ts,
            CompactionDecision.decision == "granted",
        )
        .order_by(CompactionDecision.ts),
    ):
        if subtree is not None:
            out.setdefault(subtree, []).append(float(ts))
    return out


def pressure_intervals(conn: Conn, start_ts: float, end_ts: float) -> list[tuple[float, float]]:
    """Sorted, merged intervals in which some sidecar's KV demand was above its pool (raw samples)."""
    points = rows(
        conn,
        select(Sample.series_id, Sample.ts, Sample.value)
        .join(Series, Series.id == Sample.series_id)
        .where(Series.signal == sig.DEMAND_FRACTION, Sample.ts >= start_ts, Sample.ts < end_ts)
        .order_by(Sample.series_id, Sample.ts),
    )
    per_series: dict[int, list[tuple[float, float | None]]] = {}
    for series_id, ts, value in points:
        per_series.setdefault(series_id, []).append((float(ts), value))
    return above_pool_intervals(per_series.values())


def as_turn(row: dict[str, Any]) -> Turn:
    return Turn(
        ts=row["ts"],
        prompt_tokens=row["prompt_tokens"] or 0,
        cached_tokens=row["cached_tokens"],
        completion_tokens=row["completion_tokens"] or 0,
        session=row["session_id"],
        subtree=row["subtree_id"],
        sidecar=str(row["target_id"]),
        parked_s=row["parked_s"] or 0.0,
        latency_s=row["latency_s"] or 0.0,
    )


def miss_attribution(
    conn: Conn,
    *,
    sidecar_ids: Sequence[int],
    start_ts: float,
    end_ts: float,
    bucket_s: float,
    engine_hits: dict[float, float] | None = None,
    top_sessions: int = 20,
) -> dict[str, Any]:
    """Missed tokens by cause over ``[start_ts, end_ts)``.

    Returns ``{"buckets": [{"ts", "cached", <cause>: tokens, ..., "recomputed": tokens or None}],
    "totals": {cause: tokens}, "sessions": [{"session", "turns", "prompt_tokens", "missed", <cause>...}]}``,
    sessions ordered by missed tokens (the `MISS_CAUSES`), most first. ``engine_hits``: the engine's
    prefix cache hit tokens per bucket start, for ``recomputed``.
    """
    lookback = start_ts - LOOKBACK_S
    events = Events(
        prefix_changes=prefix_changes(conn, lookback, end_ts),
        pressure=pressure_intervals(conn, lookback, end_ts),
    )
    attributor = Attributor(events)
    wanted = set(sidecar_ids)
    buckets: dict[float, dict[str, Any]] = {}
    per_session: dict[str, dict[str, Any]] = {}
    for row in turns(conn, start_ts=lookback, end_ts=end_ts):
        if row["outcome"] != "ok" or row["prompt_tokens"] is None:
            continue
        parts = attributor.add(as_turn(row))
        if row["ts"] < start_ts or row["target_id"] not in wanted:
            continue
        key = start_ts + math.floor((row["ts"] - start_ts) / bucket_s) * bucket_s
        bucket = buckets.setdefault(key, {"ts": key, "cached": 0, **dict.fromkeys(CAUSES, 0)})
        bucket["cached"] += row["cached_tokens"] or 0
        for cause, n in parts.items():
            bucket[cause] += n
        if row["session_id"] is not None:
            s = per_session.setdefault(
                row["session_id"],
                {
                    "session": row["session_id"],
                    "turns": 0,
                    "prompt_tokens": 0,
                    "missed": 0,
                    **dict.fromkeys(CAUSES, 0),
                },
            )
            s["turns"] += 1
            s["prompt_tokens"] += row["prompt_tokens"]
            for cause, n in parts.items():
                s[cause] += n
                if cause in MISS_CAUSES:
                    s["missed"] += n
    ordered = [buckets[k] for k in sorted(buckets)]
    for b in ordered:
        b["recomputed"] = (
            recomputed_hits((engine_hits or {}).get(b["ts"]), b["cached"])
            if engine_hits is not None
            else None
        )
    totals = dict.fromkeys(CAUSES, 0)
    for b in ordered:
        for cause in CAUSES:
            totals[cause] += b[cause]
    sessions = sorted(per_session.values(), key=lambda s: (-s["missed"], s["session"]))[:top_sessions]
    return {"buckets": ordered, "totals": totals, "sessions": sessions}
