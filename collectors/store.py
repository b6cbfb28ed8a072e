"""The collectors' single writer: scrape outcomes, alerts, outbox, rollups and retention.

All methods run on the writer thread (or directly in tests and benchmarks). Writes are
batched: every `write` is one transaction with one multi-row insert per table.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, delete, func, insert, select, update

from collectors.config import CollectorConfig
from collectors.scrape import ScrapeOutcome
from core.alerts import Transition
from db.models import (
    Alert,
    AuditEntry,
    CollectorHeartbeat,
    CollectorState,
    CompactionDecision,
    Notification,
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
from db.queries import RAW_RETENTION_KEY, ROLLUP10_WATERMARK_KEY, ROLLUP_WATERMARK_KEY

log = logging.getLogger(__name__)

ROLLUP_LAG_S = 15.0  # minutes end this long before they are rolled up (late samples still land)
ROLLUP_MAX_MINUTES = 120  # per call, so catching up after downtime is done in short transactions
IN_CHUNK = 500


def _chunks(items: Sequence[Any], size: int = IN_CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


class Store:
    def __init__(self, engine: Engine, *, clock: Any = time.time, name: str = "collectors") -> None:
        self.engine = engine
        self.clock = clock
        self.name = name
        self.target_ids: dict[str, int] = {}
        self.target_roles: dict[str, str] = {}
        self._series: dict[tuple[int, str, str], int] = {}
        self._sessions: dict[int, dict[str, int]] = {}
        self._subtrees: dict[int, dict[str, int]] = {}
        self.started_ts = clock()

    # ------------------------------------------------------------------ targets

    def sync_targets(self, config: CollectorConfig) -> dict[str, int]:
        """Upsert the configured targets; targets no longer listed are kept (history) as configured=False."""
        now = self.clock()
        specs: list[dict[str, Any]] = []
        for e in config.engines:
            specs.append({"url": e.url, "role": "engine", "configured_kind": e.kind, "name": e.name,
                          "labels": dict(e.labels), "engine_url": None, "interval_s": config.interval_for(e)})
        for s in config.sidecars:
            specs.append({"url": s.url, "role": "sidecar", "configured_kind": "sidecar", "name": s.name,
                          "labels": dict(s.labels), "engine_url": s.engine, "interval_s": config.interval_for(s)})
        with self.engine.begin() as conn:
            existing = {r.url: r for r in conn.execute(select(Target.id, Target.url, Target.kind))}
            for spec in specs:
                row = existing.get(spec["url"])
                if row is None:
                    kind = "sidecar" if spec["role"] == "sidecar" else (
                        spec["configured_kind"] if spec["configured_kind"] != "auto" else "unknown")
                    conn.execute(insert(Target).values(**spec, kind=kind, configured=True, up=False,
                                                       consecutive_failures=0, created_ts=now))
                else:
                    values = dict(spec, configured=True)
                    if spec["configured_kind"] in ("vllm", "sglang"):
                        values["kind"] = spec["configured_kind"]
                    conn.execute(update(Target).where(Target.id == row.id).values(**values))
            listed = [s["url"] for s in specs]
            conn.execute(update(Target).where(Target.url.not_in(listed) if listed else Target.id.is_not(None))
                         .values(configured=False, up=False))
            rows = conn.execute(select(Target.id, Target.url, Target.role)).all()
        self.target_ids = {r.url: r.id for r in rows}
        self.target_roles = {r.url: r.role for r in rows}
        return {url: self.target_ids[url] for url in listed}

    def target_health(self) -> dict[str, dict[str, Any]]:
        """Scrape bookkeeping per target URL, to seed a restarted collector's alert evaluator."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Target.url, Target.up, Target.last_scrape_ts, Target.last_success_ts,
                                       Target.consecutive_failures, Target.last_error)).all()
        return {r.url: dict(r._mapping) for r in rows}

    def cursors(self, url: str) -> tuple[int, int]:
        """(highest decision id, highest audit id) already stored for a sidecar."""
        target_id = self.target_ids[url]
        with self.engine.connect() as conn:
            d = conn.execute(select(func.max(CompactionDecision.remote_id))
                             .where(CompactionDecision.target_id == target_id)).scalar()
            a = conn.execute(select(func.max(AuditEntry.remote_id)).where(AuditEntry.target_id == target_id)).scalar()
        return int(d or 0), int(a or 0)

    # ------------------------------------------------------------------ scrape outcomes

    def _series_ids(self, conn: Connection, keys: set[tuple[int, str, str]]) -> None:
        missing = [k for k in keys if k not in self._series]
        if not missing:
            return
        target_ids = sorted({k[0] for k in missing})
        for chunk in _chunks(target_ids):
            for row in conn.execute(select(Series.id, Series.target_id, Series.engine_label, Series.signal)
                                    .where(Series.target_id.in_(chunk))):
                self._series[(row.target_id, row.engine_label, row.signal)] = row.id
        new = [k for k in missing if k not in self._series]
        if new:
            conn.execute(insert(Series), [{"target_id": t, "engine_label": label, "signal": s} for t, label, s in new])
            for chunk in _chunks(target_ids):
                for row in conn.execute(select(Series.id, Series.target_id, Series.engine_label, Series.signal)
                                        .where(Series.target_id.in_(chunk))):
                    self._series[(row.target_id, row.engine_label, row.signal)] = row.id

    def write(self, outcomes: Sequence[ScrapeOutcome]) -> None:
        """Store a batch of scrape outcomes in one transaction."""
        outcomes = [o for o in outcomes if o.url in self.target_ids]
        if not outcomes:
            return
        with self.engine.begin() as conn:
            self._write(conn, outcomes)

    def _write(self, conn: Connection, outcomes: Sequence[ScrapeOutcome]) -> None:
        from core import signals as sig

        sample_rows: list[tuple[tuple[int, str, str], float, float]] = []
        target_updates: list[dict[str, Any]] = []
        for o in outcomes:
            tid = self.target_ids[o.url]
            samples = o.samples if o.ok else [("", sig.UP, 0.0), ("", sig.SCRAPE_DURATION_S, o.duration_s)]
            for label, name, value in samples:
                if value is None or not math.isfinite(value):
                    continue
                sample_rows.append(((tid, label, name), o.ts, float(value)))
            update_row: dict[str, Any] = {"b_id": tid, "p_up": o.ok, "p_ts": o.ts, "p_dur": o.duration_s}
            target_updates.append(update_row)
        self._series_ids(conn, {k for k, _, _ in sample_rows})
        if sample_rows:
            # One series can be sampled twice at the same instant only by a clock step; keep the last.
            dedup = {(self._series[k], ts): value for k, ts, value in sample_rows}
            conn.execute(insert(Sample), [{"series_id": sid, "ts": ts, "value": v} for (sid, ts), v in dedup.items()])
        conn.execute(update(Target).where(Target.id == bindparam("b_id"))
                     .values(up=bindparam("p_up"), last_scrape_ts=bindparam("p_ts"),
                             scrape_duration_s=bindparam("p_dur")), target_updates)
        ok_rows = [{"b_id": self.target_ids[o.url], "p_ts": o.ts, "p_kind": o.kind or "unknown",
                    "p_pst": o.process_start_ts} for o in outcomes if o.ok]
        if ok_rows:
            conn.execute(update(Target).where(Target.id == bindparam("b_id"))
                         .values(last_success_ts=bindparam("p_ts"), kind=bindparam("p_kind"),
                                 process_start_ts=bindparam("p_pst"), consecutive_failures=0, last_error=None),
                         ok_rows)
        bad_rows = [{"b_id": self.target_ids[o.url], "p_ts": o.ts, "p_err": (o.error or "unknown error")[:2000]}
                    for o in outcomes if not o.ok]
        if bad_rows:
            conn.execute(update(Target).where(Target.id == bindparam("b_id"))
                         .values(last_error=bindparam("p_err"), last_error_ts=bindparam("p_ts"),
                                 consecutive_failures=Target.consecutive_failures + 1), bad_rows)
        for o in outcomes:
            if o.ok and o.role == "sidecar":
                self._write_sidecar(conn, self.target_ids[o.url], o)

    def _write_sidecar(self, conn: Connection, tid: int, o: ScrapeOutcome) -> None:
        from collectors.sidecar_docs import state_meta

        if o.state is not None:
            meta = state_meta(o.state)
            updated = conn.execute(update(SidecarState).where(SidecarState.target_id == tid)
                                   .values(ts=o.ts, state=o.state, **meta)).rowcount
            if not updated:
                conn.execute(insert(SidecarState).values(target_id=tid, ts=o.ts, state=o.state, **meta))
        if o.sessions is not None:
            self._upsert_listing(conn, Session, "session_id", self._sessions, tid, o.sessions, o.ts)
        if o.subtrees is not None:
            self._upsert_listing(conn, Subtree, "subtree_id", self._subtrees, tid, o.subtrees, o.ts)
        for model, rows in ((CompactionDecision, o.decisions), (AuditEntry, o.audit)):
            if not rows:
                continue
            ids = [r["remote_id"] for r in rows]
            have: set[int] = set()
            for chunk in _chunks(ids):
                have.update(conn.execute(select(model.remote_id).where(model.target_id == tid,
                                                                       model.remote_id.in_(chunk))).scalars())
            fresh = [dict(r, target_id=tid, ts=r["ts"] if r["ts"] is not None else o.ts)
                     for r in rows if r["remote_id"] not in have]
            if model is AuditEntry:
                fresh = [dict(r, source="sidecar") for r in fresh]
            if fresh:
                conn.execute(insert(model), fresh)

    def _upsert_listing(self, conn: Connection, model: Any, key: str, cache: dict[int, dict[str, int]], tid: int,
                        rows: list[dict[str, Any]], ts: float) -> None:
        known = cache.get(tid)
        if known is None:
            known = cache[tid] = {r[0]: r[1] for r in conn.execute(
                select(getattr(model, key), model.id).where(model.target_id == tid))}
        seen: dict[str, dict[str, Any]] = {}
        for row in rows:
            seen[row[key]] = row
        updates = [{"b_id": known[k], "p_last_seen_ts": ts, **{f"p_{c}": v for c, v in row.items() if c != key}}
                   for k, row in seen.items() if k in known]
        inserts = [dict(row, target_id=tid, first_seen_ts=ts, last_seen_ts=ts) for k, row in seen.items()
                   if k not in known]
        if updates:
            columns = [c[2:] for c in updates[0] if c.startswith("p_")]
            conn.execute(update(model).where(model.id == bindparam("b_id"))
                         .values({c: bindparam(f"p_{c}") for c in columns}), updates)
        if inserts:
            conn.execute(insert(model), inserts)
            for r in conn.execute(select(getattr(model, key), model.id).where(model.target_id == tid)):
                known[r[0]] = r[1]
        gone = [row_id for k, row_id in known.items() if k not in seen]
        for chunk in _chunks(gone):
            conn.execute(update(model).where(model.id.in_(chunk), model.present.is_(True)).values(present=False))

    # ------------------------------------------------------------------ alerts and outbox

    def open_alert_keys(self) -> list[tuple[str, str, str]]:
        """(rule, target URL, engine label) of every firing alert (restored into the evaluator at start)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Alert.rule, Target.url, Alert.engine_label)
                                .join(Target, Target.id == Alert.target_id).where(Alert.state == "firing")).all()
        return [(r.rule, r.url, r.engine_label) for r in rows]

    def silenced(self, conn: Connection, rule: str, target_id: int | None, now: float) -> bool:
        stmt = select(func.count()).select_from(Silence).where(
            Silence.starts_ts <= now, Silence.ends_ts > now,
            (Silence.rule.is_(None)) | (Silence.rule == rule),
            (Silence.target_id.is_(None)) | (Silence.target_id == target_id))
        return bool(conn.execute(stmt).scalar())

    def apply_transitions(self, transitions: Sequence[Transition], config: CollectorConfig) -> list[int]:
        """Open/close alert rows and queue notifications; returns the ids of alerts touched."""
        if not transitions:
            return []
        from collectors import notify

        touched: list[int] = []
        with self.engine.begin() as conn:
            for t in transitions:
                url, label = t.key
                tid = self.target_ids.get(url)
                if t.event == "firing":
                    already = conn.execute(select(Alert.id).where(Alert.rule == t.rule, Alert.target_id == tid,
                                                                  Alert.engine_label == label,
                                                                  Alert.state == "firing")).scalar()
                    if already is not None:
                        continue
                    silenced = self.silenced(conn, t.rule, tid, t.ts)
                    alert_id = conn.execute(insert(Alert).values(
                        rule=t.rule, target_id=tid, engine_label=label, severity=t.severity, state="firing",
                        started_ts=t.ts, last_eval_ts=t.ts, summary=t.summary, values=t.values,
                        silenced=silenced).returning(Alert.id)).scalar_one()
                    log.warning("alert firing: %s on %s%s: %s", t.rule, url, f" engine {label}" if label else "",
                                t.summary)
                else:
                    alert_id = conn.execute(select(Alert.id).where(Alert.rule == t.rule, Alert.target_id == tid,
                                                                   Alert.engine_label == label,
                                                                   Alert.state == "firing")
                                            .order_by(Alert.started_ts.desc())).scalar()
                    if alert_id is None:
                        continue
                    conn.execute(update(Alert).where(Alert.id == alert_id)
                                 .values(state="resolved", resolved_ts=t.ts, last_eval_ts=t.ts))
                    log.info("alert resolved: %s on %s%s", t.rule, url, f" engine {label}" if label else "")
                touched.append(alert_id)
                notify.queue(conn, alert_id, t.event, config.webhooks, now=t.ts)
        return touched

    def resolve_alerts_of_removed_targets(self, now: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(Alert).where(Alert.state == "firing",
                                             Alert.target_id.in_(select(Target.id).where(Target.configured.is_(False))))
                         .values(state="resolved", resolved_ts=now,
                                 summary=Alert.summary + " (target removed from the configuration)"))

    # ------------------------------------------------------------------ heartbeat, rollups, retention

    def heartbeat(self, *, targets: int, targets_up: int, config_path: str | None, info: dict[str, Any]) -> None:
        now = self.clock()
        values = {"pid": os.getpid(), "host": socket.gethostname(), "started_ts": self.started_ts,
                  "last_beat_ts": now, "targets": targets, "targets_up": targets_up, "config_path": config_path,
                  "info": info}
        with self.engine.begin() as conn:
            if not conn.execute(update(CollectorHeartbeat).where(CollectorHeartbeat.name == self.name)
                                .values(**values)).rowcount:
                conn.execute(insert(CollectorHeartbeat).values(name=self.name, **values))

    def _state(self, conn: Connection, key: str) -> float | None:
        return conn.execute(select(CollectorState.value).where(CollectorState.key == key)).scalar()

    def _set_state(self, conn: Connection, key: str, value: float) -> None:
        if not conn.execute(update(CollectorState).where(CollectorState.key == key).values(value=value)).rowcount:
            conn.execute(insert(CollectorState).values(key=key, value=value))

    def all_series_ids(self, conn: Connection) -> list[int]:
        return list(conn.execute(select(Series.id).order_by(Series.id)).scalars())

    @staticmethod
    def _first_bucket(conn: Connection, table: Any, ids: Sequence[int], bucket_s: float, *, default: float) -> float:
        """Start of the bucket holding the oldest row of `table` (samples or a rollup tier), or `default`."""
        first = None
        for chunk in _chunks(ids):
            m = conn.execute(select(func.min(table.ts)).where(table.series_id.in_(chunk))).scalar()
            if m is not None:
                first = m if first is None else min(first, m)
        return math.floor(first / bucket_s) * bucket_s if first is not None else default

    def rollup(self, now: float | None = None, *, lag_s: float = ROLLUP_LAG_S) -> int:
        """Roll complete minutes of raw samples into rollups_1m, from the watermark on. Returns rows written."""
        now = self.clock() if now is None else now
        end = math.floor((now - lag_s) / 60.0) * 60.0
        written = 0
        with self.engine.begin() as conn:
            start = self._state(conn, ROLLUP_WATERMARK_KEY)
            ids = self.all_series_ids(conn)
            if start is None:
                start = self._first_bucket(conn, Sample, ids, 60.0, default=end)
            stop = min(end, start + ROLLUP_MAX_MINUTES * 60.0)
            if stop <= start:
                if self._state(conn, ROLLUP_WATERMARK_KEY) is None:
                    self._set_state(conn, ROLLUP_WATERMARK_KEY, start)
                return 0
            for chunk in _chunks(ids):
                rows = conn.execute(select(Sample.series_id, Sample.ts, Sample.value)
                                    .where(Sample.series_id.in_(chunk), Sample.ts >= start, Sample.ts < stop)
                                    .order_by(Sample.series_id, Sample.ts)).all()
                out = rollup_rows(rows)
                if out:
                    # A restart may re-roll a minute it already wrote: replace it.
                    keys = {(r["series_id"], r["ts"]) for r in out}
                    minutes = sorted({k[1] for k in keys})
                    conn.execute(delete(Rollup1m).where(Rollup1m.series_id.in_(chunk), Rollup1m.ts >= minutes[0],
                                                        Rollup1m.ts <= minutes[-1]))
                    conn.execute(insert(Rollup1m), out)
                    written += len(out)
            self._set_state(conn, ROLLUP_WATERMARK_KEY, stop)
        if stop < end:
            return written + self.rollup(now, lag_s=lag_s)
        return written + self.rollup_10m()

    def rollup_10m(self) -> int:
        """Roll complete 10-minute periods of 1-minute rollups (up to their watermark) into rollups_10m."""
        written = 0
        with self.engine.begin() as conn:
            minute_mark = self._state(conn, ROLLUP_WATERMARK_KEY)
            if minute_mark is None:
                return 0
            end = math.floor(minute_mark / 600.0) * 600.0
            start = self._state(conn, ROLLUP10_WATERMARK_KEY)
            ids = self.all_series_ids(conn)
            if start is None:
                start = self._first_bucket(conn, Rollup1m, ids, 600.0, default=end)
            stop = min(end, start + 7 * 86400.0)  # a week per transaction when backfilling
            if stop > start:
                for chunk in _chunks(ids):
                    rows = conn.execute(select(Rollup1m.series_id, Rollup1m.ts, Rollup1m.min, Rollup1m.max,
                                               Rollup1m.mean, Rollup1m.last, Rollup1m.count)
                                        .where(Rollup1m.series_id.in_(chunk), Rollup1m.ts >= start,
                                               Rollup1m.ts < stop)
                                        .order_by(Rollup1m.series_id, Rollup1m.ts)).all()
                    out = merge_rollups(rows, 600.0)
                    if out:
                        conn.execute(delete(Rollup10m).where(Rollup10m.series_id.in_(chunk), Rollup10m.ts >= start,
                                                             Rollup10m.ts < stop))
                        conn.execute(insert(Rollup10m), out)
                        written += len(out)
            self._set_state(conn, ROLLUP10_WATERMARK_KEY, max(start, stop))
        if stop < end:
            written += self.rollup_10m()
        return written

    def retention(self, raw_retention_s: float, rollup_retention_s: float, now: float | None = None,
                  *, keep_alerts_s: float | None = None) -> tuple[int, int]:
        """Delete raw samples older than the raw window (only once rolled up) and old rollups."""
        now = self.clock() if now is None else now
        raw_removed = roll_removed = 0
        with self.engine.begin() as conn:
            watermark = self._state(conn, ROLLUP_WATERMARK_KEY)
            # Never drop what is not rolled up yet.
            raw_cutoff = min(now - raw_retention_s, watermark) if watermark is not None else -math.inf
            roll_cutoff = now - rollup_retention_s
            for chunk in _chunks(self.all_series_ids(conn)):
                if raw_cutoff > -math.inf:
                    raw_removed += conn.execute(delete(Sample).where(Sample.series_id.in_(chunk),
                                                                     Sample.ts < raw_cutoff)).rowcount or 0
                roll_removed += conn.execute(delete(Rollup1m).where(Rollup1m.series_id.in_(chunk),
                                                                    Rollup1m.ts < roll_cutoff)).rowcount or 0
                conn.execute(delete(Rollup10m).where(Rollup10m.series_id.in_(chunk), Rollup10m.ts < roll_cutoff))
            self._set_state(conn, RAW_RETENTION_KEY, raw_retention_s)
            keep = rollup_retention_s if keep_alerts_s is None else keep_alerts_s
            conn.execute(delete(Notification).where(Notification.created_ts < now - keep))
            conn.execute(delete(Session).where(Session.present.is_(False), Session.last_seen_ts < now - keep))
            conn.execute(delete(Subtree).where(Subtree.present.is_(False), Subtree.last_seen_ts < now - keep))
        return raw_removed, roll_removed


def merge_rollups(rows: Iterable[Any], period_s: float) -> list[dict[str, Any]]:
    """(series_id, ts, min, max, mean, last, count) rollups ordered by series and time -> one per period."""
    out: list[dict[str, Any]] = []
    for (series_id, period), group in groupby(rows, key=lambda r: (r[0], math.floor(r[1] / period_s) * period_s)):
        items = list(group)
        count = sum(r[6] for r in items)
        mean = sum(r[4] * r[6] for r in items) / count if count else items[-1][4]
        out.append({"series_id": series_id, "ts": period, "min": min(r[2] for r in items),
                    "max": max(r[3] for r in items), "mean": mean, "last": items[-1][5], "count": count})
    return out


def rollup_rows(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """(series_id, ts, value) rows ordered by series and time -> one rollup dict per series-minute."""
    out: list[dict[str, Any]] = []
    current: tuple[int, float] | None = None
    acc: dict[str, Any] = {}
    for series_id, ts, value in rows:
        minute = math.floor(ts / 60.0) * 60.0
        key = (series_id, minute)
        if key != current:
            if current is not None:
                acc["mean"] = acc.pop("sum") / acc["count"]
                out.append(acc)
            current = key
            acc = {"series_id": series_id, "ts": minute, "min": value, "max": value, "sum": 0.0, "last": value,
                   "count": 0}
        acc["min"] = min(acc["min"], value)
        acc["max"] = max(acc["max"], value)
        acc["sum"] += value
        acc["last"] = value
        acc["count"] += 1
    if current is not None:
        acc["mean"] = acc.pop("sum") / acc["count"]
        out.append(acc)
    return out
