"""The collectors' single writer: scrape outcomes, alerts, outbox, rollups and retention.

All methods run on the writer thread (or directly in tests and benchmarks). Writes are
batched: every `write` is one transaction with one multi-row insert per table.

Row-id caches (series, sessions, subtrees) are transactional: any failed transaction drops
them all, so an id handed out inside a rolled-back transaction (which the database then
reuses for another row) is never used again. A failed write never raises: `write` returns
what was committed and what failed, with a one-line cause, and the caller retries or
re-reads (sidecar cursors only advance past committed entries).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, func, insert, select, update
from sqlalchemy.exc import OperationalError

from collectors.config import CollectorConfig
from collectors.failures import describe_failure
from collectors.rollups import Rollups, merge_rollups, rollup_rows
from collectors.scrape import LogCursor, ScrapeOutcome
from collectors.store_sidecar import chunks as _chunks
from collectors.store_sidecar import write_sidecar
from core.alerts import Transition
from db.models import (
    Alert,
    AuditEntry,
    CollectorHeartbeat,
    CompactionDecision,
    Sample,
    Series,
    Silence,
    Target,
    Turn,
)

__all__ = ["Store", "WriteResult", "describe_failure", "merge_rollups", "rollup_rows"]

log = logging.getLogger(__name__)


@dataclass
class WriteResult:
    committed: list[ScrapeOutcome] = field(default_factory=list)
    failed: list[ScrapeOutcome] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)  # one line each


def target_specific(exc: BaseException) -> bool:
    """False for failures of the database as a whole (locked, full, unreachable): retrying each
    target alone would only wait for the same lock once per target."""
    return not isinstance(exc, OperationalError)


class Store(Rollups):
    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.time, name: str = "collectors") -> None:
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
            specs.append({"url": e.url, "role": "source" if e.kind == "prometheus" else "engine",
                          "configured_kind": e.kind, "name": e.name,
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

    def cursors(self, url: str) -> dict[str, LogCursor]:
        """Where reading a sidecar's decision and audit logs resumes: the newest stored entry of each."""
        target_id = self.target_ids[url]
        out: dict[str, LogCursor] = {}
        with self.engine.connect() as conn:
            for log_name, model, key_column in (("decisions", CompactionDecision, CompactionDecision.decision),
                                                ("audit", AuditEntry, AuditEntry.action),
                                                ("turns", Turn, Turn.outcome)):
                row = conn.execute(select(model.epoch, model.remote_id, model.ts, key_column)
                                   .where(model.target_id == target_id, model.remote_id.is_not(None))
                                   .order_by(model.epoch.desc(), model.remote_id.desc()).limit(1)).first()
                out[log_name] = LogCursor() if row is None else LogCursor(
                    epoch=int(row[0]), after_id=int(row[1] or 0), ts=row[2], key=row[3])
        return out

    # ------------------------------------------------------------------ scrape outcomes

    def _forget(self) -> None:
        """Drop every row-id cache: after a rollback they may name rows that no longer exist."""
        self._series.clear()
        self._sessions.clear()
        self._subtrees.clear()

    def retention(self, raw_retention_s: float, rollup_retention_s: float, now: float | None = None,
                  *, keep_alerts_s: float | None = None) -> tuple[int, int]:
        """`Rollups.retention`; it deletes old session and subtree rows, so their cached ids go too."""
        try:
            return super().retention(raw_retention_s, rollup_retention_s, now, keep_alerts_s=keep_alerts_s)
        finally:
            self._sessions.clear()
            self._subtrees.clear()

    def _series_ids(self, conn: Connection, keys: set[tuple[int, str, str]]) -> None:
        missing = [k for k in keys if k not in self._series]
        if not missing:
            return
        target_ids = sorted({k[0] for k in missing})

        def load() -> None:
            for chunk in _chunks(target_ids):
                for row in conn.execute(select(Series.id, Series.target_id, Series.engine_label, Series.signal)
                                        .where(Series.target_id.in_(chunk))):
                    self._series[(row.target_id, row.engine_label, row.signal)] = row.id

        load()
        new = [k for k in missing if k not in self._series]
        if new:
            conn.execute(insert(Series), [{"target_id": t, "engine_label": label, "signal": s} for t, label, s in new])
            load()

    def write(self, outcomes: Sequence[ScrapeOutcome]) -> WriteResult:
        """Store a batch of scrape outcomes in one transaction.

        When that fails on the data of some target (not on the database as a whole: locked, full,
        unreachable), each target's outcomes are written again in a transaction of their own, so
        one bad target does not cost the others their data. Never raises for a failed write: the
        result lists what was committed and what failed, with a one-line cause.
        """
        result = WriteResult()
        outcomes = [o for o in outcomes if o.url in self.target_ids]
        if not outcomes:
            return result
        try:
            self._transaction(outcomes)
            result.committed.extend(outcomes)
            return result
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none may stop the writer
            if len({o.url for o in outcomes}) == 1 or not target_specific(exc):
                result.failed.extend(outcomes)
                result.causes.append(describe_failure(exc))
                return result
        by_url: dict[str, list[ScrapeOutcome]] = {}
        for o in outcomes:
            by_url.setdefault(o.url, []).append(o)
        for url, group in by_url.items():
            try:
                self._transaction(group)
                result.committed.extend(group)
            except Exception as exc:  # noqa: BLE001
                result.failed.extend(group)
                result.causes.append(f"{url}: {describe_failure(exc)}")
        return result

    def write_derived(self, rows: Sequence[tuple[str, str, str, float, float]]) -> None:
        """Store signals the collectors compute themselves (the collapse risk), one transaction:
        ``(target URL, engine label, signal, ts, value)``. Raises on failure (the caller logs it)."""
        samples = [((self.target_ids[url], label, name), ts, float(value)) for url, label, name, ts, value in rows
                   if url in self.target_ids and math.isfinite(value)]
        if not samples:
            return
        try:
            with self.engine.begin() as conn:
                self._series_ids(conn, {k for k, _, _ in samples})
                dedup = {(self._series[k], ts): value for k, ts, value in samples}
                conn.execute(insert(Sample), [{"series_id": sid, "ts": ts, "value": v} for (sid, ts), v in dedup.items()])
        except BaseException:
            self._forget()
            raise

    def _transaction(self, outcomes: Sequence[ScrapeOutcome]) -> None:
        try:
            with self.engine.begin() as conn:
                self._write(conn, outcomes)
        except BaseException:
            self._forget()
            raise

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
            target_updates.append({"b_id": tid, "p_up": o.ok, "p_ts": o.ts, "p_dur": o.duration_s})
        self._series_ids(conn, {k for k, _, _ in sample_rows})
        if sample_rows:
            # One series can be sampled twice at the same instant only by a clock step; keep the last.
            dedup = {(self._series[k], ts): value for k, ts, value in sample_rows}
            have: set[tuple[int, float]] = set()
            if any(o.retried for o in outcomes):  # a retried batch may have landed in part before
                for chunk in _chunks(sorted({sid for sid, _ in dedup})):
                    have.update((r[0], r[1]) for r in conn.execute(
                        select(Sample.series_id, Sample.ts).where(Sample.series_id.in_(chunk),
                                                                 Sample.ts.in_({ts for _, ts in dedup}))))
            rows = [{"series_id": sid, "ts": ts, "value": v} for (sid, ts), v in dedup.items() if (sid, ts) not in have]
            if rows:
                conn.execute(insert(Sample), rows)
        # A retried (older) outcome never overwrites what a newer one already recorded.
        newer_or_first = (Target.id == bindparam("b_id")) & (
            Target.last_scrape_ts.is_(None) | (Target.last_scrape_ts <= bindparam("p_ts")))
        conn.execute(update(Target).where(newer_or_first)
                     .values(up=bindparam("p_up"), last_scrape_ts=bindparam("p_ts"),
                             scrape_duration_s=bindparam("p_dur")), target_updates)
        ok_rows = [{"b_id": self.target_ids[o.url], "p_ts": o.ts, "p_kind": o.kind or "unknown",
                    "p_pst": o.process_start_ts} for o in outcomes if o.ok]
        if ok_rows:
            conn.execute(update(Target).where(newer_or_first)
                         .values(last_success_ts=bindparam("p_ts"), kind=bindparam("p_kind"),
                                 process_start_ts=bindparam("p_pst"), consecutive_failures=0, last_error=None),
                         ok_rows)
        bad_rows = [{"b_id": self.target_ids[o.url], "p_ts": o.ts, "p_err": (o.error or "unknown error")[:2000]}
                    for o in outcomes if not o.ok]
        if bad_rows:
            conn.execute(update(Target).where(newer_or_first)
                         .values(last_error=bindparam("p_err"), last_error_ts=bindparam("p_ts"),
                                 consecutive_failures=Target.consecutive_failures + 1), bad_rows)
        for o in outcomes:
            if o.ok and o.role == "sidecar":
                write_sidecar(conn, self.target_ids[o.url], o, self._sessions, self._subtrees)

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
                    open_id = conn.execute(select(Alert.id).where(Alert.rule == t.rule, Alert.target_id == tid,
                                                                  Alert.engine_label == label,
                                                                  Alert.state == "firing")
                                           .order_by(Alert.started_ts.desc())).scalar()
                    if open_id is None:
                        continue
                    alert_id = open_id
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

