"""The newest sample of each series, per (target, engine label, signal), and per target.

`latest_samples` is the one read of "newest values" (one index seek per series on the
``(series_id, ts)`` primary key), optionally *as of* a past time (the newest sample at or before
it: what a paused dashboard shows); `latest_signals` groups it by (target, engine label) with
the target's columns, `target_totals` folds data-parallel ranks into one row per target.
`up_as_of` is each target's scrape health at a past time, from the ``up`` samples the collectors
write for every scrape (1 or 0).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select

from core import signals as sig
from db.models import Sample, Series
from db.queries._common import Conn, engine_in, engine_out, id_list, run
from db.queries.targets import targets


def latest_samples(
    conn: Conn,
    *,
    target_ids: Sequence[int] | int | None = None,
    signals: Sequence[str] | None = None,
    max_age_s: float | None = None,
    now: float | None = None,
    as_of: float | None = None,
) -> list[dict[str, Any]]:
    """``{"series_id", "target_id", "engine", "signal", "ts", "value"}`` per series that has samples
    (those older than `max_age_s` before `now` left out). With `as_of`: the newest sample at or before
    that time (a series with none then is left out)."""
    ids = id_list(target_ids)
    if ids is not None and not ids:
        return []
    in_time = [Sample.series_id == Series.id]
    if as_of is not None:
        in_time.append(Sample.ts <= as_of)
    newest_ts = select(func.max(Sample.ts)).where(*in_time).correlate(Series).scalar_subquery()
    newest_val = (
        select(Sample.value)
        .where(*in_time)
        .order_by(Sample.ts.desc())
        .limit(1)
        .correlate(Series)
        .scalar_subquery()
    )
    stmt = select(
        Series.id,
        Series.target_id,
        Series.engine_label,
        Series.signal,
        newest_ts.label("ts"),
        newest_val.label("value"),
    )
    if ids is not None:
        stmt = stmt.where(Series.target_id.in_(ids))
    if signals is not None:
        stmt = stmt.where(Series.signal.in_(list(signals)))
    cutoff = None if max_age_s is None else (now if now is not None else time.time()) - max_age_s
    out = []
    for r in run(conn, stmt):
        if r["ts"] is None or r["value"] is None or (cutoff is not None and r["ts"] < cutoff):
            continue
        out.append(
            {
                "series_id": r["id"],
                "target_id": r["target_id"],
                "engine": engine_out(r["engine_label"]),
                "signal": r["signal"],
                "ts": float(r["ts"]),
                "value": float(r["value"]),
            }
        )
    return out


def latest_signals(
    conn: Conn,
    *,
    target_ids: Sequence[int] | None = None,
    signals: Sequence[str] | None = None,
    max_age_s: float | None = None,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Newest sample of every series: one dict per (target, engine label) with
    ``target_id, url, name, role, kind, up, engine, ts`` (newest of its samples) and one key per
    canonical signal present (its newest value). Samples older than `max_age_s` are left out."""
    samples = latest_samples(conn, target_ids=target_ids, signals=signals, max_age_s=max_age_s, now=now)
    target_info = {t["id"]: t for t in targets(conn)}
    grouped: dict[tuple[int, str | None], dict[str, Any]] = {}
    for row in samples:
        info = target_info.get(row["target_id"], {})
        entry = grouped.setdefault(
            (row["target_id"], row["engine"]),
            {
                "target_id": row["target_id"],
                "url": info.get("url"),
                "name": info.get("name"),
                "role": info.get("role"),
                "kind": info.get("kind"),
                "up": info.get("up"),
                "engine": row["engine"],
                "ts": None,
            },
        )
        entry[row["signal"]] = row["value"]
        entry["ts"] = max(entry["ts"] or 0.0, row["ts"])
    return sorted(grouped.values(), key=lambda e: (e["role"] or "", e["url"] or "", e["engine"] or ""))


def target_totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`latest_signals` rows of engines with several engine labels (data-parallel ranks) folded into
    one row per target (``engine`` None): additive signals summed, ``engine_hit_ratio`` recomputed from
    the summed hits and queries, ``kv_usage`` weighted by each label's pool. Other rows pass through."""
    by_target: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_target.setdefault(row["target_id"], []).append(row)
    out: list[dict[str, Any]] = []
    for group in by_target.values():
        labelled = [r for r in group if r["engine"] is not None]
        if len(labelled) <= 1:
            out.extend(group)
            continue
        total: dict[str, Any] = {
            k: labelled[0][k] for k in ("target_id", "url", "name", "role", "kind", "up")
        }
        total["engine"] = None
        total["engines"] = sorted(r["engine"] for r in labelled)
        total["ts"] = max(r["ts"] for r in group)
        for row in group:
            if row["engine"] is None:
                total.update({k: v for k, v in row.items() if k in sig.TARGET_SIGNALS})
        for name in sig.ADDITIVE_SIGNALS:
            values = [r[name] for r in labelled if r.get(name) is not None]
            if values:
                total[name] = sum(values)
        hits, queries_ = total.get(sig.PREFIX_CACHE_HITS_PER_S), total.get(sig.PREFIX_CACHE_QUERIES_PER_S)
        if hits is not None and queries_:
            total[sig.ENGINE_HIT_RATIO] = min(1.0, max(0.0, hits / queries_))
        weighted = [
            (r[sig.KV_USAGE], r.get(sig.POOL_TOKENS) or 0.0)
            for r in labelled
            if r.get(sig.KV_USAGE) is not None
        ]
        if weighted:
            pool = sum(p for _, p in weighted)
            total[sig.KV_USAGE] = (
                sum(u * p for u, p in weighted) / pool
                if pool
                else sum(u for u, _ in weighted) / len(weighted)
            )
        out.append(total)
    return out


def latest_value(
    conn: Conn, target_id: int, signal: str, engine: str | None = None
) -> tuple[float, float] | None:
    """(ts, value) of the newest sample of one series, or None."""
    stmt = (
        select(Sample.ts, Sample.value)
        .join(Series, Series.id == Sample.series_id)
        .where(
            Series.target_id == target_id, Series.signal == signal, Series.engine_label == engine_in(engine)
        )
        .order_by(Sample.ts.desc())
        .limit(1)
    )
    found = run(conn, stmt)
    return (found[0]["ts"], found[0]["value"]) if found else None


def up_as_of(conn: Conn, as_of: float, target_ids: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Each target's scrape health at `as_of` from its ``up`` samples (target-level series):
    ``{"target_id", "ts"`` (its newest scrape then), ``"up"`` (that scrape's outcome),
    ``"last_success_ts"`` (newest ``up`` = 1 then, or None)}; targets with no scrape by then are left out."""
    found = latest_samples(conn, target_ids=target_ids, signals=[sig.UP], as_of=as_of)
    if not found:
        return []
    by_target: dict[int, dict[str, Any]] = {}  # the collectors write it target-level; any label counts
    for r in found:
        if r["target_id"] not in by_target or r["ts"] > by_target[r["target_id"]]["ts"]:
            by_target[r["target_id"]] = r
    newest = list(by_target.values())
    success: dict[int, float] = {}
    for r in newest:  # up then: that scrape is the last success; down: walk back its series to the last one
        if r["value"] >= 1.0:
            success[r["target_id"]] = r["ts"]
            continue
        stmt = (
            select(Sample.ts)
            .where(Sample.series_id == r["series_id"], Sample.ts <= as_of, Sample.value >= 1.0)
            .order_by(Sample.ts.desc())
            .limit(1)
        )
        last_ok = run(conn, stmt)
        if last_ok:
            success[r["target_id"]] = float(last_ok[0]["ts"])
    return [
        {
            "target_id": r["target_id"],
            "ts": r["ts"],
            "up": r["value"] >= 1.0,
            "last_success_ts": success.get(r["target_id"]),
        }
        for r in sorted(newest, key=lambda r: r["target_id"])
    ]
