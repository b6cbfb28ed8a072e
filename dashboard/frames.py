"""The pages' data as plain objects and pandas frames, built on `db.queries` (the one SQL layer).

No SQL here: each function calls a `db.queries` read and shapes its rows for a page. The pages
wrap these in `st.cache_data(ttl=...)` (see `dashboard.data`).

What an "engine" is here: an engine target (role ``engine``) together with the
sidecar(s) whose ``engine_url`` is its URL. A sidecar whose engine is not
scraped still makes an engine entry (named after the sidecar). Engines are listed
in natural name order (engine-2 before engine-10).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from sqlalchemy import Connection, Engine

from core.signals import ADDITIVE_SIGNALS
from db import queries as dbq

logger = logging.getLogger(__name__)

MAX_POINTS = 1000  # per series and chart up to LONG_SPAN_S
LONG_SPAN_MAX_POINTS = 500  # beyond it: a 24 h or 7 d chart reads the coarser rollups (measured: 71 -> 8 ms)
LONG_SPAN_S = 6 * 3600.0
_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[Any, ...]:
    """Sort key putting engine-2 before engine-10."""
    return tuple(int(part) if part.isdigit() else part.lower() for part in _DIGITS.split(text))


@dataclass(frozen=True)
class EngineRef:
    key: str
    engine_target_id: int | None
    sidecar_target_id: int | None
    engine_url: str | None
    sidecar_url: str | None
    kind: str
    sidecar_name: str | None = None
    labels: tuple[str, ...] = ()  # "key=value" labels of its targets (for the Overview's filter)

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
    configured = dbq.targets(conn, configured_only=True)
    engines = [t for t in configured if t["role"] == "engine"]
    sidecars = [t for t in configured if t["role"] == "sidecar"]
    # A sidecar configured without `engine` still names the engine it fronts in its /state.
    reported = {r["target_id"]: r["state"].get("engine") for r in dbq.sidecar_state(conn)
                if isinstance(r["state"], dict)}
    by_engine_url: dict[str, Any] = {}
    for s in sorted(sidecars, key=lambda t: (t["name"] or "", t["id"])):
        engine_url = s["engine_url"] or reported.get(s["id"])
        if isinstance(engine_url, str) and engine_url:
            by_engine_url.setdefault(engine_url.rstrip("/"), s)
    result: list[EngineRef] = []
    used: set[int] = set()

    def labels(*found: Any) -> tuple[str, ...]:
        pairs = {f"{k}={v}" for t in found if t is not None and isinstance(t["labels"], dict)
                 for k, v in t["labels"].items()}
        return tuple(sorted(pairs))

    for e in engines:
        s = by_engine_url.get(e["url"].rstrip("/"))
        if s is not None:
            used.add(s["id"])
        result.append(EngineRef(key=e["name"] or e["url"], engine_target_id=e["id"],
                                sidecar_target_id=s["id"] if s else None, engine_url=e["url"],
                                sidecar_url=s["url"] if s else None, kind=e["kind"],
                                sidecar_name=(s["name"] or s["url"]) if s else None, labels=labels(e, s)))
    for s in sidecars:
        if s["id"] not in used:
            result.append(EngineRef(key=s["name"] or s["url"], engine_target_id=None, sidecar_target_id=s["id"],
                                    engine_url=s["engine_url"], sidecar_url=s["url"], kind="unknown",
                                    sidecar_name=s["name"] or s["url"], labels=labels(s)))
    return sorted(result, key=lambda r: natural_key(r.key))


def target_health(conn: Connection) -> dict[int, TargetHealth]:
    return {t["id"]: TargetHealth(t["id"], t["role"], t["name"] or t["url"], t["url"], bool(t["up"]),
                                  t["last_scrape_ts"], t["last_success_ts"], t["last_error"],
                                  t["consecutive_failures"] or 0) for t in dbq.targets(conn)}


def heartbeats(conn: Connection) -> list[dict[str, Any]]:
    return [{k: h[k] for k in ("name", "pid", "host", "started_ts", "last_beat_ts", "targets", "targets_up")}
            for h in dbq.heartbeat(conn)]


# --------------------------------------------------------------------------- series
def latest(conn: Connection, target_ids: Iterable[int], signals: Iterable[str] | None = None) -> Latest:
    """The newest raw sample of each series."""
    ids = list(target_ids)
    out = Latest()
    if not ids:
        return out
    for r in dbq.latest_samples(conn, target_ids=ids, signals=None if signals is None else list(signals)):
        out.values[(r["target_id"], r["engine"] or "", r["signal"])] = (r["ts"], r["value"])
    return out


def max_points_for(span_s: float) -> int:
    return MAX_POINTS if span_s <= LONG_SPAN_S else LONG_SPAN_MAX_POINTS


def step_for_span(span_s: float) -> float:
    """Bucket width of a chart over `span_s` (0 = raw samples), as `db.queries` chooses it."""
    return dbq.choose_resolution(0.0, span_s, max_points=max_points_for(span_s))[1]


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
    result = dbq.series_range(conn, signals=list(signals), start_ts=start, end_ts=end, target_ids=ids,
                              max_points=max_points or max_points_for(end - start))
    # One frame from flat columns: a frame per series costs ~0.4 ms each, 0.3 s for a 200-engine fleet chart.
    ts: list[float] = []
    tids: list[int] = []
    labels: list[str] = []
    names: list[str] = []
    values: list[float] = []
    for s in result["series"]:
        n = len(s["ts"])
        if not n:
            continue
        ts.extend(s["ts"])
        values.extend(s["value"])
        tids.extend([s["target_id"]] * n)
        labels.extend([s["engine"] or ""] * n)
        names.extend([s["signal"]] * n)
    if not ts:
        return pd.DataFrame(columns=columns)
    data = pd.DataFrame({"ts": ts, "target_id": tids, "engine_label": labels, "signal": names, "value": values})
    data["ts"] = data["ts"].astype(float)
    data["value"] = pd.to_numeric(data["value"], errors="coerce")
    return data[columns]


# ------------------------------------------------------------------ sidecar objects
def sidecar_states(conn: Connection) -> dict[int, dict[str, Any]]:
    return {r["target_id"]: {"ts": r["ts"], "state": r["state"] or {}, "regime": r["regime"],
                             "budgeter_mode": r["budgeter_mode"],
                             "compaction_deferred_until": r["compaction_deferred_until"],
                             "warnings": list(r["warnings"] or [])} for r in dbq.sidecar_state(conn)}


SESSION_COLUMNS = ["target_id", "session_id", "state", "context_tokens", "turns", "last_cached_fraction",
                   "parked_since", "manual", "pinned", "first_seen_ts", "last_seen_ts", "present", "data"]


def sessions_frame(conn: Connection, sidecar_target_ids: Sequence[int], *, include_gone: bool = False
                   ) -> pd.DataFrame:
    if not sidecar_target_ids:
        return pd.DataFrame(columns=SESSION_COLUMNS)
    records = []
    for s in dbq.sessions(conn, target_id=list(sidecar_target_ids), present_only=not include_gone,
                          limit=1_000_000):
        data = s["data"] or {}
        parked_since = data.get("parked_since")
        records.append({**{k: s[k] for k in SESSION_COLUMNS if k in s}, "data": data,
                        "parked_since": float(parked_since) if isinstance(parked_since, int | float) else None})
    frame = pd.DataFrame.from_records(records, columns=SESSION_COLUMNS)
    return frame.sort_values(["target_id", "session_id"], ignore_index=True) if len(frame) else frame


def subtrees_frame(conn: Connection, sidecar_target_ids: Sequence[int]) -> pd.DataFrame:
    columns = ["target_id", "subtree_id", "tokens", "warm", "pinned", "recent_hits", "last_hit_ts", "last_seen_ts"]
    if not sidecar_target_ids:
        return pd.DataFrame(columns=columns)
    found = dbq.subtrees(conn, target_id=list(sidecar_target_ids), limit=1_000_000)
    return pd.DataFrame.from_records([{k: r[k] for k in columns} for r in found], columns=columns)


def decisions_frame(conn: Connection, sidecar_target_ids: Sequence[int], start: float, end: float,
                    limit: int = 500) -> pd.DataFrame:
    columns = ["ts", "target_id", "subtree_id", "decision", "granted", "reason", "divergence"]
    if not sidecar_target_ids:
        return pd.DataFrame(columns=columns)
    found = dbq.compaction_decisions(conn, target_id=list(sidecar_target_ids), since_ts=start, until_ts=end,
                                     limit=limit)
    return pd.DataFrame.from_records([{k: r[k] for k in columns} for r in found], columns=columns)


# ------------------------------------------------------------------ audit and alerts
def audit_frame(conn: Connection, start: float, end: float, *, target_ids: Sequence[int] | None = None,
                limit: int = 5000) -> pd.DataFrame:
    columns = ["ts", "source", "target_id", "target", "actor", "action", "params", "outcome", "before", "after"]
    records = []
    for entry in dbq.audit(conn, target_id=target_ids, since_ts=start, until_ts=end, limit=limit):
        data = entry["data"] or {}
        records.append({"ts": entry["ts"], "source": entry["source"], "target_id": entry["target_id"],
                        "target": entry["target_name"] or entry["target_url"] or "", "actor": entry["actor"],
                        "action": entry["action"], "params": entry["params"] or {}, "outcome": entry["outcome"],
                        "before": data.get("before"), "after": data.get("after")})
    return pd.DataFrame.from_records(records, columns=columns)


ALERT_COLUMNS = ["id", "rule", "target_id", "target", "engine_label", "severity", "state", "started_ts",
                 "resolved_ts", "summary", "values", "acknowledged_by", "acknowledged_ts", "silenced"]


def alerts_frame(conn: Connection, *, since: float, until: float | None = None,
                 target_ids: Sequence[int] | None = None) -> pd.DataFrame:
    """Firing alerts (whenever they started) and alerts that started or resolved after `since`, newest first."""
    records = []
    for a in dbq.alerts(conn, target_id=target_ids, since_ts=since, until_ts=until, limit=100_000):
        records.append({**{k: a[k] for k in ALERT_COLUMNS if k in a}, "target": a["target_name"] or a["target_url"] or "",
                        "values": a["values"] or {}, "silenced": bool(a["silenced"])})
    frame = pd.DataFrame.from_records(records, columns=ALERT_COLUMNS)
    return frame.sort_values("started_ts", ascending=False, ignore_index=True) if len(frame) else frame


def silences_frame(conn: Connection, now: float) -> pd.DataFrame:
    """Silences not yet ended at `now`, the soonest to end first."""
    columns = ["id", "rule", "target_id", "target", "starts_ts", "ends_ts", "created_by", "comment"]
    found = dbq.silences(conn, ending_after=now)
    frame = pd.DataFrame.from_records([{**{k: r[k] for k in columns if k in r}, "target": r["target_name"]}
                                       for r in found], columns=columns)
    return frame.sort_values("ends_ts", ignore_index=True) if len(frame) else frame


def events_frame(conn: Connection, ref: EngineRef, start: float, end: float) -> pd.DataFrame:
    """Markers for an engine's charts: operator actions, compaction decisions, alerts opening and closing."""
    ids = list(ref.target_ids)
    records: list[dict[str, Any]] = []
    if ids:
        audit = audit_frame(conn, start, end, target_ids=ids, limit=500)
        for r in audit.itertuples():
            if r.action in SIGN_IN_ACTIONS:
                continue
            what = r.params.get("mode") if isinstance(r.params, dict) and r.params.get("mode") else r.action
            records.append({"ts": r.ts, "kind": "action", "label": f"{r.actor or '?'}: {what}",
                            "text": f"{r.actor or '?'}: {r.action} {_compact(r.params)} -> {r.outcome}"})
        if ref.sidecar_target_id is not None:
            dec = decisions_frame(conn, [ref.sidecar_target_id], start, end, limit=500)
            for r in dec.itertuples():
                records.append({"ts": r.ts, "kind": "compaction", "label": "",
                                "text": f"compaction {r.decision or '?'} {r.subtree_id or ''}: {r.reason or ''}"})
        for a in dbq.alerts(conn, target_id=ids, since_ts=start, until_ts=end, limit=1000):
            if start <= a["started_ts"] <= end:
                records.append({"ts": a["started_ts"], "kind": "alert", "label": f"{a['rule']} fired",
                                "text": f"alert {a['rule']} ({a['severity']}) opened: {a['summary']}"})
            if a["resolved_ts"] is not None and start <= a["resolved_ts"] <= end:
                records.append({"ts": a["resolved_ts"], "kind": "alert", "label": f"{a['rule']} resolved",
                                "text": f"alert {a['rule']} closed"})
    frame = pd.DataFrame.from_records(records, columns=["ts", "kind", "label", "text"])
    return frame.sort_values("ts").reset_index(drop=True)


SIGN_IN_ACTIONS = frozenset({"sign-in", "sign-out"})  # who signed in is no event on an engine's charts


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
    dbq.record_dashboard_action(engine, actor=actor, action=action, target_url=target_url,
                                params=params or {}, outcome=outcome[:2000], ts=now)


def acknowledge_alert(engine: Engine, alert_id: int, actor: str, now: float | None = None) -> bool:
    """Mark an alert acknowledged; False when it is unknown or already acknowledged."""
    return dbq.acknowledge_alert(engine, alert_id, by=actor, ts=now)


def add_silence(engine: Engine, *, rule: str | None, target_id: int | None, minutes: float, actor: str,
                comment: str | None = None, now: float | None = None) -> None:
    if math.isnan(minutes) or not (0 < minutes <= 7 * 24 * 60):
        raise ValueError(f"silence duration must be between 1 minute and 7 days, got {minutes!r} minutes")
    dbq.add_silence(engine, rule=rule, target_id=target_id, duration_s=minutes * 60, by=actor,
                    comment=comment, now=now)


def expire_silence(engine: Engine, silence_id: int, now: float | None = None) -> bool:
    """End a silence now; False when it is unknown or already over."""
    return dbq.expire_silence(engine, silence_id, now=now)


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
