"""Read (and the few writes) the pages need, over the collectors' schema (`db.models`).

Plain functions over a SQLAlchemy `Connection`/`Engine`, returning plain data
or pandas frames, so the pages stay thin and tests can call them directly. The
pages wrap them in `st.cache_data(ttl=...)` (see `dashboard.data`).

What an "engine" is here: an engine target (role ``engine``) together with the
sidecar(s) whose ``engine_url`` is its URL. A sidecar whose engine is not
scraped still makes an engine entry (named after the sidecar).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from sqlalchemy import Connection, Engine, and_, func, or_, select

from core.signals import ADDITIVE_SIGNALS
from db import queries as db_queries
from db.models import (
    Alert,
    AuditEntry,
    CollectorHeartbeat,
    CompactionDecision,
    Sample,
    Series,
    Session,
    SidecarState,
    Silence,
    Subtree,
    Target,
)

logger = logging.getLogger(__name__)

MAX_POINTS = 1000  # per series and chart up to LONG_SPAN_S
LONG_SPAN_MAX_POINTS = 500  # beyond it: a 24 h or 7 d chart reads the coarser rollups (measured: 71 -> 8 ms)
LONG_SPAN_S = 6 * 3600.0


@dataclass(frozen=True)
class EngineRef:
    key: str
    engine_target_id: int | None
    sidecar_target_id: int | None
    engine_url: str | None
    sidecar_url: str | None
    kind: str
    sidecar_name: str | None = None

    @property
    def target_ids(self) -> tuple[int, ...]:
        return tuple(t for t in (self.engine_target_id, self.sidecar_target_id) if t is not None)


@dataclass(frozen=True)
class TargetHealth:
    target_id: int
    role: str
    name: str
    url: str
    up: bool
    last_scrape_ts: float | None
    last_success_ts: float | None
    last_error: str | None
    consecutive_failures: int


@dataclass
class Latest:
    """Latest sample per (target, engine label, signal)."""

    values: dict[tuple[int, str, str], tuple[float, float]] = field(default_factory=dict)

    def get(self, target_id: int | None, signal: str, label: str = "") -> tuple[float, float] | None:
        if target_id is None:
            return None
        return self.values.get((target_id, label, signal))

    def value(self, target_id: int | None, signal: str, label: str = "") -> float | None:
        got = self.get(target_id, signal, label)
        return None if got is None else got[1]

    def labels(self, target_id: int | None) -> list[str]:
        return sorted({lab for (tid, lab, _sig) in self.values if tid == target_id})

    def summed(self, target_id: int | None, signal: str) -> float | None:
        """Sum over engine labels (for additive signals: rates, counts, pool)."""
        vals = [v for (tid, _lab, sig), (_ts, v) in self.values.items() if tid == target_id and sig == signal]
        return sum(vals) if vals else None


# ----------------------------------------------------------------- targets / engines
def list_engines(conn: Connection) -> list[EngineRef]:
    rows = conn.execute(select(*Target.__table__.columns).where(Target.configured.is_(True))
                        .order_by(Target.name, Target.id)).all()
    targets = list(rows)
    engines = [t for t in targets if t.role == "engine"]
    sidecars = [t for t in targets if t.role == "sidecar"]
    # A sidecar configured without `engine` still names the engine it fronts in its /state.
    reported = {r.target_id: r.state.get("engine") for r in conn.execute(
        select(SidecarState.target_id, SidecarState.state)).all() if isinstance(r.state, dict)}
    by_engine_url: dict[str, Any] = {}
    for s in sidecars:
        engine_url = s.engine_url or reported.get(s.id)
        if isinstance(engine_url, str) and engine_url:
            by_engine_url.setdefault(engine_url.rstrip("/"), s)
    result: list[EngineRef] = []
    used: set[int] = set()
    for e in engines:
        s = by_engine_url.get(e.url.rstrip("/"))
        if s is not None:
            used.add(s.id)
        result.append(EngineRef(key=e.name or e.url, engine_target_id=e.id, sidecar_target_id=s.id if s else None,
                                engine_url=e.url, sidecar_url=s.url if s else None, kind=e.kind,
                                sidecar_name=(s.name or s.url) if s else None))
    for s in sidecars:
        if s.id not in used:
            result.append(EngineRef(key=s.name or s.url, engine_target_id=None, sidecar_target_id=s.id,
                                    engine_url=s.engine_url, sidecar_url=s.url, kind="unknown",
                                    sidecar_name=s.name or s.url))
    return result


def target_health(conn: Connection) -> dict[int, TargetHealth]:
    rows = conn.execute(select(Target.id, Target.role, Target.name, Target.url, Target.up, Target.last_scrape_ts,
                               Target.last_success_ts, Target.last_error, Target.consecutive_failures))
    return {r.id: TargetHealth(r.id, r.role, r.name or r.url, r.url, bool(r.up), r.last_scrape_ts,
                               r.last_success_ts, r.last_error, r.consecutive_failures or 0) for r in rows}


def heartbeats(conn: Connection) -> list[dict[str, Any]]:
    rows = conn.execute(select(*CollectorHeartbeat.__table__.columns).order_by(CollectorHeartbeat.name)).all()
    return [{"name": h.name, "pid": h.pid, "host": h.host, "started_ts": h.started_ts,
             "last_beat_ts": h.last_beat_ts, "targets": h.targets, "targets_up": h.targets_up} for h in rows]


# --------------------------------------------------------------------------- series
def series_ids(conn: Connection, target_ids: Iterable[int], signals: Iterable[str] | None = None
               ) -> dict[int, tuple[int, str, str]]:
    """series id -> (target id, engine label, signal)."""
    ids = list(target_ids)
    if not ids:
        return {}
    stmt = select(Series.id, Series.target_id, Series.engine_label, Series.signal).where(Series.target_id.in_(ids))
    if signals is not None:
        stmt = stmt.where(Series.signal.in_(list(signals)))
    return {r.id: (r.target_id, r.engine_label or "", r.signal) for r in conn.execute(stmt)}


def latest(conn: Connection, target_ids: Iterable[int], signals: Iterable[str] | None = None) -> Latest:
    """The newest raw sample of each series (index seeks, one per series)."""
    sids = series_ids(conn, target_ids, signals)
    if not sids:
        return Latest()
    newest_ts = (select(func.max(Sample.ts)).where(Sample.series_id == Series.id).correlate(Series)
                 .scalar_subquery())
    newest_val = (select(Sample.value).where(Sample.series_id == Series.id).order_by(Sample.ts.desc()).limit(1)
                  .correlate(Series).scalar_subquery())
    stmt = select(Series.id, newest_ts.label("ts"), newest_val.label("value")).where(Series.id.in_(list(sids)))
    out = Latest()
    for r in conn.execute(stmt):
        if r.ts is not None and r.value is not None:
            out.values[sids[r.id]] = (float(r.ts), float(r.value))
    return out


def max_points_for(span_s: float) -> int:
    return MAX_POINTS if span_s <= LONG_SPAN_S else LONG_SPAN_MAX_POINTS


def step_for_span(span_s: float) -> float:
    """Bucket width of a chart over `span_s` (0 = raw samples), as `db.queries` chooses it."""
    return db_queries.choose_resolution(0.0, span_s, max_points=max_points_for(span_s))[1]


def series_frame(conn: Connection, target_ids: Iterable[int], signals: Iterable[str], start: float, end: float,
                 max_points: int | None = None) -> pd.DataFrame:
    """Samples of the given signals in [start, end] as (ts, target_id, engine_label, signal, value).

    Resolution (raw, bucketed raw, 1-minute rollups plus the raw minutes after the
    rollup watermark) is chosen by `db.queries.series_range` so no series has more
    than `max_points` points.
    """
    columns = ["ts", "target_id", "engine_label", "signal", "value"]
    ids = list(target_ids)
    if not ids:
        return pd.DataFrame(columns=columns)
    result = db_queries.series_range(conn, signals=list(signals), start_ts=start, end_ts=end, target_ids=ids,
                                     max_points=max_points or max_points_for(end - start))
    frames = []
    for s in result["series"]:
        if not s["ts"]:
            continue
        frames.append(pd.DataFrame({"ts": s["ts"], "target_id": s["target_id"], "engine_label": s["engine"] or "",
                                    "signal": s["signal"], "value": s["value"]}))
    if not frames:
        return pd.DataFrame(columns=columns)
    data = pd.concat(frames, ignore_index=True)
    data["ts"] = data["ts"].astype(float)
    data["value"] = pd.to_numeric(data["value"], errors="coerce")
    return data[columns]


# ------------------------------------------------------------------ sidecar objects
def sidecar_states(conn: Connection) -> dict[int, dict[str, Any]]:
    rows = conn.execute(select(*SidecarState.__table__.columns)).all()
    return {r.target_id: {"ts": r.ts, "state": r.state or {}, "regime": r.regime, "budgeter_mode": r.budgeter_mode,
                          "compaction_deferred_until": r.compaction_deferred_until,
                          "warnings": list(r.warnings or [])} for r in rows}


def sessions_frame(conn: Connection, sidecar_target_ids: Sequence[int], *, include_gone: bool = False
                   ) -> pd.DataFrame:
    columns = ["target_id", "session_id", "state", "context_tokens", "turns", "last_cached_fraction",
               "parked_since", "manual", "pinned", "first_seen_ts", "last_seen_ts", "present", "data"]
    if not sidecar_target_ids:
        return pd.DataFrame(columns=columns)
    stmt = select(*Session.__table__.columns).where(Session.target_id.in_(list(sidecar_target_ids)))
    if not include_gone:
        stmt = stmt.where(Session.present.is_(True))
    records = []
    for s in conn.execute(stmt.order_by(Session.target_id, Session.session_id)).all():
        data = s.data or {}
        parked_since = data.get("parked_since")
        records.append({"target_id": s.target_id, "session_id": s.session_id, "state": s.state,
                        "context_tokens": s.context_tokens, "turns": s.turns,
                        "last_cached_fraction": s.last_cached_fraction,
                        "parked_since": float(parked_since) if isinstance(parked_since, int | float) else None,
                        "manual": s.manual, "pinned": s.pinned, "first_seen_ts": s.first_seen_ts,
                        "last_seen_ts": s.last_seen_ts, "present": s.present, "data": data})
    return pd.DataFrame.from_records(records, columns=columns)


def subtrees_frame(conn: Connection, sidecar_target_ids: Sequence[int]) -> pd.DataFrame:
    columns = ["target_id", "subtree_id", "tokens", "warm", "pinned", "recent_hits", "last_hit_ts", "last_seen_ts"]
    if not sidecar_target_ids:
        return pd.DataFrame(columns=columns)
    rows = conn.execute(select(Subtree.target_id, Subtree.subtree_id, Subtree.tokens, Subtree.warm, Subtree.pinned,
                               Subtree.recent_hits, Subtree.last_hit_ts, Subtree.last_seen_ts)
                        .where(Subtree.target_id.in_(list(sidecar_target_ids)), Subtree.present.is_(True))
                        .order_by(Subtree.recent_hits.desc().nulls_last(), Subtree.subtree_id)).all()
    return pd.DataFrame(rows, columns=columns)


def decisions_frame(conn: Connection, sidecar_target_ids: Sequence[int], start: float, end: float,
                    limit: int = 500) -> pd.DataFrame:
    columns = ["ts", "target_id", "subtree_id", "decision", "granted", "reason", "divergence"]
    if not sidecar_target_ids:
        return pd.DataFrame(columns=columns)
    rows = conn.execute(select(CompactionDecision.ts, CompactionDecision.target_id, CompactionDecision.subtree_id,
                               CompactionDecision.decision, CompactionDecision.granted, CompactionDecision.reason,
                               CompactionDecision.divergence)
                        .where(CompactionDecision.target_id.in_(list(sidecar_target_ids)),
                               CompactionDecision.ts >= start, CompactionDecision.ts <= end)
                        .order_by(CompactionDecision.ts.desc()).limit(limit)).all()
    return pd.DataFrame(rows, columns=columns)


# ------------------------------------------------------------------ audit and alerts
def audit_frame(conn: Connection, start: float, end: float, *, target_ids: Sequence[int] | None = None,
                limit: int = 5000) -> pd.DataFrame:
    columns = ["ts", "source", "target_id", "target", "actor", "action", "params", "outcome", "before", "after"]
    stmt = (select(*AuditEntry.__table__.columns, Target.name.label("t_name"), Target.url.label("t_url")).outerjoin(Target, AuditEntry.target_id == Target.id)
            .where(AuditEntry.ts >= start, AuditEntry.ts <= end))
    if target_ids is not None:
        stmt = stmt.where(AuditEntry.target_id.in_(list(target_ids)))
    records = []
    for entry in conn.execute(stmt.order_by(AuditEntry.ts.desc()).limit(limit)).all():
        name, url = entry.t_name, entry.t_url
        data = entry.data or {}
        records.append({"ts": entry.ts, "source": entry.source, "target_id": entry.target_id,
                        "target": name or url or "", "actor": entry.actor, "action": entry.action,
                        "params": entry.params or {}, "outcome": entry.outcome,
                        "before": data.get("before"), "after": data.get("after")})
    return pd.DataFrame.from_records(records, columns=columns)


def alerts_frame(conn: Connection, *, since: float, target_ids: Sequence[int] | None = None) -> pd.DataFrame:
    """Firing alerts (whenever they started) and alerts that resolved after `since`."""
    columns = ["id", "rule", "target_id", "target", "engine_label", "severity", "state", "started_ts",
               "resolved_ts", "summary", "values", "acknowledged_by", "acknowledged_ts", "silenced"]
    stmt = (select(*Alert.__table__.columns, Target.name.label("t_name"), Target.url.label("t_url")).outerjoin(Target, Alert.target_id == Target.id)
            .where(or_(Alert.state == "firing", Alert.resolved_ts >= since, Alert.started_ts >= since)))
    if target_ids is not None:
        stmt = stmt.where(Alert.target_id.in_(list(target_ids)))
    records = []
    for a in conn.execute(stmt.order_by(Alert.started_ts.desc())).all():
        name, url = a.t_name, a.t_url
        records.append({"id": a.id, "rule": a.rule, "target_id": a.target_id, "target": name or url or "",
                        "engine_label": a.engine_label, "severity": a.severity, "state": a.state,
                        "started_ts": a.started_ts, "resolved_ts": a.resolved_ts, "summary": a.summary,
                        "values": a.values or {}, "acknowledged_by": a.acknowledged_by,
                        "acknowledged_ts": a.acknowledged_ts, "silenced": bool(a.silenced)})
    return pd.DataFrame.from_records(records, columns=columns)


def silences_frame(conn: Connection, now: float) -> pd.DataFrame:
    columns = ["id", "rule", "target_id", "target", "starts_ts", "ends_ts", "created_by", "comment"]
    rows = conn.execute(select(Silence.id, Silence.rule, Silence.target_id, Target.name, Silence.starts_ts,
                               Silence.ends_ts, Silence.created_by, Silence.comment)
                        .outerjoin(Target, Silence.target_id == Target.id)
                        .where(Silence.ends_ts > now).order_by(Silence.ends_ts)).all()
    return pd.DataFrame(rows, columns=columns)


def events_frame(conn: Connection, ref: EngineRef, start: float, end: float) -> pd.DataFrame:
    """Markers for an engine's charts: operator actions, compaction decisions, alerts opening and closing."""
    ids = list(ref.target_ids)
    records: list[dict[str, Any]] = []
    if ids:
        audit = audit_frame(conn, start, end, target_ids=ids, limit=500)
        for r in audit.itertuples():
            records.append({"ts": r.ts, "kind": "action",
                            "text": f"{r.actor or '?'}: {r.action} {_compact(r.params)} -> {r.outcome}"})
        if ref.sidecar_target_id is not None:
            dec = decisions_frame(conn, [ref.sidecar_target_id], start, end, limit=500)
            for r in dec.itertuples():
                records.append({"ts": r.ts, "kind": "compaction",
                                "text": f"compaction {r.decision or '?'} {r.subtree_id or ''}: {r.reason or ''}"})
        rows = conn.execute(select(Alert.rule, Alert.severity, Alert.started_ts, Alert.resolved_ts, Alert.summary)
                            .where(Alert.target_id.in_(ids),
                                   or_(and_(Alert.started_ts >= start, Alert.started_ts <= end),
                                       and_(Alert.resolved_ts >= start, Alert.resolved_ts <= end)))).all()
        for r in rows:
            if start <= r.started_ts <= end:
                records.append({"ts": r.started_ts, "kind": "alert",
                                "text": f"alert {r.rule} ({r.severity}) opened: {r.summary}"})
            if r.resolved_ts is not None and start <= r.resolved_ts <= end:
                records.append({"ts": r.resolved_ts, "kind": "alert",
                                "text": f"alert {r.rule} closed"})
    return pd.DataFrame.from_records(records, columns=["ts", "kind", "text"]).sort_values("ts").reset_index(drop=True)


def _compact(params: Any) -> str:
    if not params:
        return ""
    if isinstance(params, dict):
        return " ".join(f"{k}={v}" for k, v in params.items())
    return str(params)


# -------------------------------------------------------------------------- writes
def write_audit(engine: Engine, *, actor: str | None, action: str, outcome: str, params: dict[str, Any] | None = None,
                target_url: str | None = None, now: float | None = None) -> None:
    """One dashboard audit row (source='dashboard'), in its own short transaction."""
    db_queries.record_dashboard_action(engine, actor=actor, action=action, target_url=target_url,
                                       params=params or {}, outcome=outcome[:2000], ts=now)


def acknowledge_alert(engine: Engine, alert_id: int, actor: str, now: float | None = None) -> bool:
    """Mark an alert acknowledged; False when it is unknown or already acknowledged."""
    return db_queries.acknowledge_alert(engine, alert_id, by=actor, ts=now)


def add_silence(engine: Engine, *, rule: str | None, target_id: int | None, minutes: float, actor: str,
                comment: str | None = None, now: float | None = None) -> None:
    if math.isnan(minutes) or not (0 < minutes <= 7 * 24 * 60):
        raise ValueError(f"silence duration must be between 1 minute and 7 days, got {minutes!r} minutes")
    db_queries.add_silence(engine, rule=rule, target_id=target_id, duration_s=minutes * 60, by=actor,
                           comment=comment, now=now)


def combine_ranks(frame: pd.DataFrame) -> pd.DataFrame:
    """One value per (target, signal, time) over data-parallel ranks.

    Additive signals (`core.signals.ADDITIVE_SIGNALS`: rates, counts, pool) are
    summed; gauges and quantiles are averaged; the engine hit ratio is recomputed
    as summed hits / summed queries where both are present.
    """
    if frame.empty or frame["engine_label"].nunique() <= 1:
        return frame
    keys = ["ts", "target_id", "signal"]
    additive = frame["signal"].isin(ADDITIVE_SIGNALS)
    out = pd.concat([frame[additive].groupby(keys, as_index=False)["value"].sum(),
                     frame[~additive].groupby(keys, as_index=False)["value"].mean()], ignore_index=True)
    wide = out.pivot_table(index=["ts", "target_id"], columns="signal", values="value")
    if {"prefix_cache_hits_per_s", "prefix_cache_queries_per_s"} <= set(wide.columns):
        ratio = (wide["prefix_cache_hits_per_s"] / wide["prefix_cache_queries_per_s"].where(
            wide["prefix_cache_queries_per_s"] > 0)).dropna()
        replaced = ratio.rename("value").reset_index()
        replaced["signal"] = "engine_hit_ratio"
        out = pd.concat([out[out["signal"] != "engine_hit_ratio"], replaced], ignore_index=True)
    out["engine_label"] = ""
    return out[["ts", "target_id", "engine_label", "signal", "value"]]
