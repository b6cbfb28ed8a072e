"""The queries the pages (and `collectors status`) need. Every function takes a SQLAlchemy
``Connection`` (or ``Engine``) and returns plain data: lists of dicts with the column names of
`db.models`, timestamps as epoch-second floats, ``engine`` = the engine label or None.

Reads only, except the few dashboard writes at the end (`record_dashboard_action`,
`acknowledge_alert`, `add_silence`, `expire_silence`).

Resolution: `series_range` picks raw samples or 1-minute rollups from the requested range so
no series has more than `max_points` points (default 2000), and buckets further when needed.
Rolled-up minutes come from ``rollups_1m``; the minutes after the rollup watermark (the
newest, not yet rolled up) come from raw samples, so a live chart has no hole at its end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

from sqlalchemy import BigInteger, Connection, Engine, and_, case, cast, func, insert, or_, select, update
from sqlalchemy.sql import ColumnElement

from core import signals as sig
from db.models import (
    Alert,
    AuditEntry,
    CollectorHeartbeat,
    CollectorState,
    CompactionDecision,
    Rollup1m,
    Rollup10m,
    Sample,
    Series,
    Session,
    SidecarState,
    Silence,
    Subtree,
    Target,
)

DEFAULT_MAX_POINTS = 2000
RAW_BUCKET_LIMIT_S = 15.0  # coarser buckets than this read the 1-minute rollups instead of raw samples
ROLLUP_1M_LIMIT_S = 120.0  # coarser buckets than this read the 10-minute rollups
ROLLUP_WATERMARK_KEY = "rollup_watermark_ts"  # collector_state key: minutes before it are rolled up
ROLLUP10_WATERMARK_KEY = "rollup10_watermark_ts"  # 10-minute periods before it are in rollups_10m
RAW_RETENTION_KEY = "raw_retention_s"

Conn = Connection | Engine


def _run(conn: Conn, stmt: Any, params: Any = None) -> list[dict[str, Any]]:
    if isinstance(conn, Engine):
        with conn.connect() as c:
            return _run(c, stmt, params)
    result = conn.execute(stmt, params) if params is not None else conn.execute(stmt)
    return [dict(row._mapping) for row in result]


def _rows(conn: Conn, stmt: Any) -> list[Any]:
    """Plain tuples (the hot path of chart queries: no per-row dict)."""
    if isinstance(conn, Engine):
        with conn.connect() as c:
            return _rows(c, stmt)
    return list(conn.execute(stmt).all())


def _append_points(rows: list[Any], out: dict[int, dict[str, Any]]) -> None:
    """(series_id, bucket, mean, min, max) rows, ordered, appended to each series after its last point."""
    for series_id, group in groupby(rows, key=itemgetter(0)):
        entry = out[series_id]
        last = entry["ts"][-1] if entry["ts"] else None
        items = [r for r in group if last is None or float(r[1]) > last]
        entry["ts"].extend(float(r[1]) for r in items)
        entry["value"].extend(r[2] for r in items)
        entry["min"].extend(r[3] for r in items)
        entry["max"].extend(r[4] for r in items)


def _engine_out(label: str | None) -> str | None:
    return label or None


def _engine_in(label: str | None) -> str:
    return label or ""


# ---------------------------------------------------------------------------------------------
# Targets and latest values


def targets(conn: Conn, *, role: str | None = None, configured_only: bool = False) -> list[dict[str, Any]]:
    """All targets, engines first, by name/URL."""
    stmt = select(*Target.__table__.columns).order_by(Target.role, Target.name, Target.url)
    if role:
        stmt = stmt.where(Target.role == role)
    if configured_only:
        stmt = stmt.where(Target.configured.is_(True))
    return _run(conn, stmt)


def target_by_url(conn: Conn, url: str) -> dict[str, Any] | None:
    rows = _run(conn, select(*Target.__table__.columns).where(Target.url == url.rstrip("/")))
    return rows[0] if rows else None


def series_list(conn: Conn, *, target_id: int | None = None, signal: str | None = None) -> list[dict[str, Any]]:
    """Series (id, target_id, engine, signal) that exist, optionally filtered."""
    stmt = select(Series.id, Series.target_id, Series.engine_label, Series.signal)
    if target_id is not None:
        stmt = stmt.where(Series.target_id == target_id)
    if signal is not None:
        stmt = stmt.where(Series.signal == signal)
    rows = _run(conn, stmt.order_by(Series.target_id, Series.engine_label, Series.signal))
    for row in rows:
        row["engine"] = _engine_out(row.pop("engine_label"))
    return rows


def latest_signals(conn: Conn, *, target_ids: Sequence[int] | None = None,
                   signals: Sequence[str] | None = None,
                   max_age_s: float | None = None, now: float | None = None) -> list[dict[str, Any]]:
    """Newest sample of every series: one dict per (target, engine label) with
    ``target_id, url, name, role, kind, up, engine, ts`` (newest of its samples) and one key per
    canonical signal present (its newest value). Samples older than `max_age_s` are left out."""
    newest_ts = (select(Sample.ts).where(Sample.series_id == Series.id)
                 .order_by(Sample.ts.desc()).limit(1).scalar_subquery())
    stmt = (select(Series.id, Series.target_id, Series.engine_label, Series.signal,
                   newest_ts.label("ts"))
            .join(Target, Target.id == Series.target_id))
    if target_ids is not None:
        stmt = stmt.where(Series.target_id.in_(list(target_ids)))
    if signals is not None:
        stmt = stmt.where(Series.signal.in_(list(signals)))
    series_rows = _run(conn, stmt)
    cutoff = None if max_age_s is None else (now if now is not None else time.time()) - max_age_s
    wanted = [(r["id"], r["ts"]) for r in series_rows if r["ts"] is not None and (cutoff is None or r["ts"] >= cutoff)]
    values: dict[int, float] = {}
    if wanted:
        # One keyed lookup per series (the (series_id, ts) primary key makes each one a seek).
        for chunk_start in range(0, len(wanted), 400):
            chunk = wanted[chunk_start:chunk_start + 400]
            cond = or_(*[and_(Sample.series_id == sid, Sample.ts == ts) for sid, ts in chunk])
            for row in _run(conn, select(Sample.series_id, Sample.value).where(cond)):
                values[row["series_id"]] = row["value"]
    target_info = {t["id"]: t for t in targets(conn)}
    grouped: dict[tuple[int, str], dict[str, Any]] = {}
    for row in series_rows:
        if row["id"] not in values:
            continue
        key = (row["target_id"], row["engine_label"])
        info = target_info.get(row["target_id"], {})
        entry = grouped.setdefault(key, {
            "target_id": row["target_id"], "url": info.get("url"), "name": info.get("name"),
            "role": info.get("role"), "kind": info.get("kind"), "up": info.get("up"),
            "engine": _engine_out(row["engine_label"]), "ts": None,
        })
        entry[row["signal"]] = values[row["id"]]
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
        total: dict[str, Any] = {k: labelled[0][k] for k in ("target_id", "url", "name", "role", "kind", "up")}
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
        weighted = [(r[sig.KV_USAGE], r.get(sig.POOL_TOKENS) or 0.0) for r in labelled if r.get(sig.KV_USAGE) is not None]
        if weighted:
            pool = sum(p for _, p in weighted)
            total[sig.KV_USAGE] = (sum(u * p for u, p in weighted) / pool if pool
                                   else sum(u for u, _ in weighted) / len(weighted))
        out.append(total)
    return out


def latest_value(conn: Conn, target_id: int, signal: str, engine: str | None = None) -> tuple[float, float] | None:
    """(ts, value) of the newest sample of one series, or None."""
    stmt = (select(Sample.ts, Sample.value).join(Series, Series.id == Sample.series_id)
            .where(Series.target_id == target_id, Series.signal == signal,
                   Series.engine_label == _engine_in(engine))
            .order_by(Sample.ts.desc()).limit(1))
    rows = _run(conn, stmt)
    return (rows[0]["ts"], rows[0]["value"]) if rows else None


# ---------------------------------------------------------------------------------------------
# Time series over a range


def _bucket_expr(conn: Conn, column: Any, bucket_s: float) -> ColumnElement[Any]:
    if conn.dialect.name == "sqlite":
        # CAST truncates toward zero in SQLite; timestamps are positive.
        return cast(column / bucket_s, BigInteger) * bucket_s
    return func.floor(column / bucket_s) * bucket_s


def choose_resolution(start_ts: float, end_ts: float, *, max_points: int = DEFAULT_MAX_POINTS,
                      raw_interval_s: float = 1.0) -> tuple[str, float]:
    """("raw" | "1m" | "10m", bucket seconds) so that (end - start) / bucket <= max_points.

    Raw samples (bucket 0 = unbucketed) while each point would cover at most 1 s; raw samples
    averaged into buckets up to 15 s; then the 1-minute rollups in buckets of whole minutes up to
    2 minutes; beyond that the 10-minute rollups in buckets of whole 10 minutes. With the default
    2,000 points: 1 h reads raw samples in 2 s buckets, 24 h the 1-minute rollups minute by minute,
    7 days the 10-minute rollups (1,008 points), 30 days 30-minute buckets of them.
    """
    span = max(0.0, end_ts - start_ts)
    needed = span / max_points if max_points > 0 else span
    if needed <= raw_interval_s:
        return "raw", 0.0
    if needed <= RAW_BUCKET_LIMIT_S:
        return "raw", float(math.ceil(needed))
    if needed <= ROLLUP_1M_LIMIT_S:
        return "1m", 60.0 * math.ceil(needed / 60.0)
    return "10m", 600.0 * math.ceil(needed / 600.0)


def rollup_watermark(conn: Conn, key: str = ROLLUP_WATERMARK_KEY) -> float | None:
    rows = _run(conn, select(CollectorState.value).where(CollectorState.key == key))
    return rows[0]["value"] if rows else None


def _read_rollups(conn: Conn, model: Any, ids: list[int], start: float, end: float, bucket: float,
                  out: dict[int, dict[str, Any]]) -> None:
    if end <= start:
        return
    native = 600.0 if model is Rollup10m else 60.0
    if bucket <= native:
        stmt = (select(model.series_id, model.ts.label("bucket"), model.mean.label("v"), model.min.label("mn"),
                       model.max.label("mx"))
                .where(model.series_id.in_(ids), model.ts >= start, model.ts < end).order_by(model.series_id, model.ts))
    else:
        b = _bucket_expr(conn, model.ts, bucket)
        stmt = (select(model.series_id, b.label("bucket"),
                       (func.sum(model.mean * model.count) / func.sum(model.count)).label("v"),
                       func.min(model.min).label("mn"), func.max(model.max).label("mx"))
                .where(model.series_id.in_(ids), model.ts >= start, model.ts < end)
                .group_by(model.series_id, b).order_by(model.series_id, b))
    _append_points(_rows(conn, stmt), out)


def series_range(conn: Conn, *, signals: Sequence[str] | str, start_ts: float, end_ts: float,
                 target_ids: Sequence[int] | None = None, engine: str | None | bool = False,
                 max_points: int = DEFAULT_MAX_POINTS, resolution: str | None = None) -> dict[str, Any]:
    """Points of the matching series in [start_ts, end_ts].

    `engine`: False = every engine label; None = the target-level series (label ""); a string =
    that label. Returns ``{"resolution": "raw"|"1m"|"10m", "bucket_s": float, "series": [{"series_id",
    "target_id", "engine", "signal", "ts": [...], "value": [...], "min": [...], "max": [...]}]}``,
    ``value`` being the mean over each bucket (the raw value when unbucketed); ``min``/``max`` are
    present when bucketed. Points are ascending in time; missing intervals are simply absent
    (draw gaps with ``connectgaps=False`` on a gap larger than a few buckets). The newest part of
    a rollup view (after the rollup watermarks) is read from the next finer tier, down to raw.
    """
    if isinstance(signals, str):
        signals = [signals]
    chosen, bucket = choose_resolution(start_ts, end_ts, max_points=max_points)
    if resolution is not None and resolution != chosen:
        chosen = resolution
        bucket = {"raw": bucket if bucket < 60 else 15.0, "1m": max(60.0, 60.0 * math.ceil(bucket / 60.0)),
                  "10m": max(600.0, 600.0 * math.ceil(bucket / 600.0))}[resolution]
    stmt = select(Series.id, Series.target_id, Series.engine_label, Series.signal).where(
        Series.signal.in_(list(signals)))
    if target_ids is not None:
        stmt = stmt.where(Series.target_id.in_(list(target_ids)))
    if engine is not False:
        stmt = stmt.where(Series.engine_label == _engine_in(engine))  # type: ignore[arg-type]
    meta = {r["id"]: r for r in _run(conn, stmt)}
    out: dict[int, dict[str, Any]] = {
        sid: {"series_id": sid, "target_id": r["target_id"], "engine": _engine_out(r["engine_label"]),
              "signal": r["signal"], "ts": [], "value": [], **({"min": [], "max": []} if bucket else {})}
        for sid, r in meta.items()
    }
    if not meta:
        return {"resolution": chosen, "bucket_s": bucket, "series": []}
    ids = list(meta)
    cursor = start_ts
    if chosen == "10m":
        mark10 = rollup_watermark(conn, ROLLUP10_WATERMARK_KEY)
        if mark10 is not None:
            _read_rollups(conn, Rollup10m, ids, cursor, min(end_ts, mark10), bucket, out)
            cursor = max(cursor, min(end_ts, mark10))
    if chosen in ("1m", "10m"):
        mark1 = rollup_watermark(conn)
        if mark1 is not None:
            _read_rollups(conn, Rollup1m, ids, cursor, min(end_ts, mark1), bucket, out)
            cursor = max(cursor, min(end_ts, mark1))
    if cursor <= end_ts:
        if bucket:
            b = _bucket_expr(conn, Sample.ts, bucket)
            sstmt = (select(Sample.series_id, b.label("bucket"), func.avg(Sample.value).label("v"),
                            func.min(Sample.value).label("mn"), func.max(Sample.value).label("mx"))
                     .where(Sample.series_id.in_(ids), Sample.ts >= cursor, Sample.ts <= end_ts)
                     .group_by(Sample.series_id, b).order_by(Sample.series_id, b))
            _append_points(_rows(conn, sstmt), out)
        else:
            sstmt = (select(Sample.series_id, Sample.ts, Sample.value)
                     .where(Sample.series_id.in_(ids), Sample.ts >= cursor, Sample.ts <= end_ts)
                     .order_by(Sample.series_id, Sample.ts))
            for series_id, group in groupby(_rows(conn, sstmt), key=itemgetter(0)):
                entry = out[series_id]
                items = list(group)
                entry["ts"].extend(r[1] for r in items)
                entry["value"].extend(r[2] for r in items)
    series = sorted(out.values(), key=lambda e: (e["target_id"], e["engine"] or "", e["signal"]))
    return {"resolution": chosen, "bucket_s": bucket, "series": series}


def series_frame(conn: Conn, **kwargs: Any) -> Any:
    """`series_range` as a long pandas DataFrame: target_id, engine, signal, ts, time (UTC), value."""
    import pandas as pd

    result = series_range(conn, **kwargs)
    frames = []
    for s in result["series"]:
        if not s["ts"]:
            continue
        frame = pd.DataFrame({"ts": s["ts"], "value": s["value"]})
        frame["target_id"], frame["engine"], frame["signal"] = s["target_id"], s["engine"], s["signal"]
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["target_id", "engine", "signal", "ts", "time", "value"])
    frame = pd.concat(frames, ignore_index=True)
    frame["time"] = pd.to_datetime(frame["ts"], unit="s", utc=True)
    return frame[["target_id", "engine", "signal", "ts", "time", "value"]]


# ---------------------------------------------------------------------------------------------
# Sidecar tables


def sidecar_state(conn: Conn, target_id: int | None = None) -> list[dict[str, Any]]:
    """Latest /state JSON per sidecar: target_id, url, name, ts, state (dict), regime, budgeter_mode, ..."""
    stmt = (select(*SidecarState.__table__.columns, Target.url, Target.name, Target.engine_url)
            .join(Target, Target.id == SidecarState.target_id).order_by(Target.url))
    if target_id is not None:
        stmt = stmt.where(SidecarState.target_id == target_id)
    return _run(conn, stmt)


def sessions(conn: Conn, *, target_id: int | None = None, present_only: bool = True,
             state: str | None = None, limit: int = 5000) -> list[dict[str, Any]]:
    """Sessions the sidecars know, largest context first."""
    stmt = select(*Session.__table__.columns, Target.url.label("target_url"), Target.name.label("target_name")) \
        .join(Target, Target.id == Session.target_id)
    if target_id is not None:
        stmt = stmt.where(Session.target_id == target_id)
    if present_only:
        stmt = stmt.where(Session.present.is_(True))
    if state is not None:
        stmt = stmt.where(Session.state == state)
    stmt = stmt.order_by(Session.context_tokens.desc().nulls_last(), Session.session_id).limit(limit)
    return _run(conn, stmt)


def subtrees(conn: Conn, *, target_id: int | None = None, present_only: bool = True,
             limit: int = 5000) -> list[dict[str, Any]]:
    stmt = select(*Subtree.__table__.columns, Target.url.label("target_url")) \
        .join(Target, Target.id == Subtree.target_id)
    if target_id is not None:
        stmt = stmt.where(Subtree.target_id == target_id)
    if present_only:
        stmt = stmt.where(Subtree.present.is_(True))
    stmt = stmt.order_by(Subtree.recent_hits.desc().nulls_last(), Subtree.subtree_id).limit(limit)
    return _run(conn, stmt)


def compaction_decisions(conn: Conn, *, target_id: int | None = None, since_ts: float | None = None,
                         limit: int = 500) -> list[dict[str, Any]]:
    """Newest first."""
    stmt = select(*CompactionDecision.__table__.columns, Target.url.label("target_url")) \
        .join(Target, Target.id == CompactionDecision.target_id)
    if target_id is not None:
        stmt = stmt.where(CompactionDecision.target_id == target_id)
    if since_ts is not None:
        stmt = stmt.where(CompactionDecision.ts >= since_ts)
    return _run(conn, stmt.order_by(CompactionDecision.ts.desc(), CompactionDecision.id.desc()).limit(limit))


def audit(conn: Conn, *, target_id: int | None = None, source: str | None = None,
          since_ts: float | None = None, limit: int = 500) -> list[dict[str, Any]]:
    """Audit trail (sidecar entries and dashboard actions), newest first."""
    stmt = select(*AuditEntry.__table__.columns, Target.url.label("target_url")) \
        .outerjoin(Target, Target.id == AuditEntry.target_id)
    if target_id is not None:
        stmt = stmt.where(AuditEntry.target_id == target_id)
    if source is not None:
        stmt = stmt.where(AuditEntry.source == source)
    if since_ts is not None:
        stmt = stmt.where(AuditEntry.ts >= since_ts)
    return _run(conn, stmt.order_by(AuditEntry.ts.desc(), AuditEntry.id.desc()).limit(limit))


# ---------------------------------------------------------------------------------------------
# Alerts, silences, heartbeat


def alerts(conn: Conn, *, state: str | None = None, target_id: int | None = None,
           since_ts: float | None = None, limit: int = 500) -> list[dict[str, Any]]:
    """Alert episodes, firing first then newest first. ``engine`` is the engine label or None."""
    stmt = select(*Alert.__table__.columns, Target.url.label("target_url"), Target.name.label("target_name")) \
        .outerjoin(Target, Target.id == Alert.target_id)
    if state is not None:
        stmt = stmt.where(Alert.state == state)
    if target_id is not None:
        stmt = stmt.where(Alert.target_id == target_id)
    if since_ts is not None:
        stmt = stmt.where(or_(Alert.state == "firing", Alert.started_ts >= since_ts,
                              Alert.resolved_ts >= since_ts))
    stmt = stmt.order_by(case((Alert.state == "firing", 0), else_=1), Alert.started_ts.desc()).limit(limit)
    rows = _run(conn, stmt)
    for row in rows:
        row["engine"] = _engine_out(row["engine_label"])
    return rows


def open_alerts(conn: Conn, target_id: int | None = None) -> list[dict[str, Any]]:
    return alerts(conn, state="firing", target_id=target_id)


def silences(conn: Conn, *, active_at: float | None = None) -> list[dict[str, Any]]:
    """Silences (active at `active_at` when given), newest first."""
    stmt = select(*Silence.__table__.columns, Target.url.label("target_url")) \
        .outerjoin(Target, Target.id == Silence.target_id)
    if active_at is not None:
        stmt = stmt.where(Silence.starts_ts <= active_at, Silence.ends_ts > active_at)
    return _run(conn, stmt.order_by(Silence.created_ts.desc()))


def heartbeat(conn: Conn) -> list[dict[str, Any]]:
    """Collector heartbeats (one row per collector process name)."""
    return _run(conn, select(*CollectorHeartbeat.__table__.columns).order_by(CollectorHeartbeat.name))


# ---------------------------------------------------------------------------------------------
# Dashboard writes (the only writes outside the collectors process)


def _write(conn: Conn, stmt: Any) -> Any:
    if isinstance(conn, Engine):
        with conn.begin() as c:
            return c.execute(stmt)
    return conn.execute(stmt)


def record_dashboard_action(conn: Conn, *, actor: str | None, action: str, target_url: str | None = None,
                            params: dict[str, Any] | None = None, outcome: str | None = None,
                            ts: float | None = None) -> None:
    """Audit one control action sent from the dashboard (source='dashboard')."""
    target_id = None
    if target_url is not None:
        found = target_by_url(conn, target_url)
        target_id = found["id"] if found else None
    _write(conn, insert(AuditEntry).values(
        source="dashboard", target_id=target_id, remote_id=None, ts=ts if ts is not None else time.time(),
        actor=actor, action=action, params=params or {}, outcome=outcome,
        data={"target_url": target_url} if target_url else {}))


def acknowledge_alert(conn: Conn, alert_id: int, *, by: str, ts: float | None = None) -> bool:
    """Mark an alert acknowledged; False when it does not exist or is already acknowledged."""
    result = _write(conn, update(Alert).where(Alert.id == alert_id, Alert.acknowledged_ts.is_(None))
                    .values(acknowledged_by=by, acknowledged_ts=ts if ts is not None else time.time()))
    return bool(result.rowcount)


def add_silence(conn: Conn, *, rule: str | None, target_id: int | None, duration_s: float, by: str | None,
                comment: str | None = None, now: float | None = None) -> None:
    """Silence notifications for `rule` (None = all rules) on `target_id` (None = all targets)."""
    if duration_s <= 0:
        raise ValueError(f"silence duration must be positive, got {duration_s}")
    start = now if now is not None else time.time()
    _write(conn, insert(Silence).values(rule=rule, target_id=target_id, starts_ts=start,
                                        ends_ts=start + duration_s, created_by=by, created_ts=start,
                                        comment=comment))


def expire_silence(conn: Conn, silence_id: int, *, now: float | None = None) -> None:
    _write(conn, update(Silence).where(Silence.id == silence_id)
           .values(ends_ts=now if now is not None else time.time()))


__all__ = [
    "acknowledge_alert", "add_silence", "alerts", "audit", "choose_resolution", "compaction_decisions",
    "expire_silence", "heartbeat", "latest_signals", "latest_value", "open_alerts", "record_dashboard_action",
    "rollup_watermark", "series_frame", "series_list", "series_range", "sessions", "sidecar_state", "silences",
    "subtrees", "target_totals", "targets", "target_by_url",
]
