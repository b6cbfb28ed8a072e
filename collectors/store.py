"""The collectors' single writer: targets, scrape outcomes, alerts, outbox, rollups and retention.

All methods run on the writer thread (or directly in tests and benchmarks). `Store` is the
targets' bookkeeping (configured targets, their health, where each sidecar log resumes) and the
heartbeat, composed with one mixin per concern:

- `collectors.store_write.ScrapeWrites`: scrape outcomes and derived signals (the batched
  write path and its transactional row-id caches);
- `collectors.store_alerts.AlertRows`: alert rows, silences and the notification outbox;
- `collectors.rollups.Rollups`: rollups and retention.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, insert, select, update

from collectors.config import CollectorConfig
from collectors.rollups import Rollups
from collectors.scrape import LogCursor
from collectors.store_alerts import AlertRows
from collectors.store_write import ScrapeWrites
from db.models import AuditEntry, CollectorHeartbeat, CompactionDecision, Target, Turn

__all__ = ["Store"]


class Store(ScrapeWrites, AlertRows, Rollups):
    def __init__(
        self, engine: Engine, *, clock: Callable[[], float] = time.time, name: str = "collectors"
    ) -> None:
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
            specs.append(
                {
                    "url": e.url,
                    "role": "source" if e.kind == "prometheus" else "engine",
                    "configured_kind": e.kind,
                    "name": e.name,
                    "labels": dict(e.labels),
                    "engine_url": None,
                    "interval_s": config.interval_for(e),
                }
            )
        for s in config.sidecars:
            specs.append(
                {
                    "url": s.url,
                    "role": "sidecar",
                    "configured_kind": "sidecar",
                    "name": s.name,
                    "labels": dict(s.labels),
                    "engine_url": s.engine,
                    "interval_s": config.interval_for(s),
                }
            )
        with self.engine.begin() as conn:
            existing = {r.url: r for r in conn.execute(select(Target.id, Target.url, Target.kind))}
            for spec in specs:
                row = existing.get(spec["url"])
                if row is None:
                    kind = (
                        "sidecar"
                        if spec["role"] == "sidecar"
                        else (spec["configured_kind"] if spec["configured_kind"] != "auto" else "unknown")
                    )
                    conn.execute(
                        insert(Target).values(
                            **spec,
                            kind=kind,
                            configured=True,
                            up=False,
                            consecutive_failures=0,
                            created_ts=now,
                        )
                    )
                else:
                    values = dict(spec, configured=True)
                    if spec["configured_kind"] in ("vllm", "sglang"):
                        values["kind"] = spec["configured_kind"]
                    conn.execute(update(Target).where(Target.id == row.id).values(**values))
            listed = [s["url"] for s in specs]
            conn.execute(
                update(Target)
                .where(Target.url.not_in(listed) if listed else Target.id.is_not(None))
                .values(configured=False, up=False)
            )
            rows = conn.execute(select(Target.id, Target.url, Target.role)).all()
        self.target_ids = {r.url: r.id for r in rows}
        self.target_roles = {r.url: r.role for r in rows}
        return {url: self.target_ids[url] for url in listed}

    def target_health(self) -> dict[str, dict[str, Any]]:
        """Scrape bookkeeping per target URL, to seed a restarted collector's alert evaluator."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    Target.url,
                    Target.up,
                    Target.last_scrape_ts,
                    Target.last_success_ts,
                    Target.consecutive_failures,
                    Target.last_error,
                )
            ).all()
        return {r.url: dict(r._mapping) for r in rows}

    def cursors(self, url: str) -> dict[str, LogCursor]:
        """Where reading a sidecar's decision and audit logs resumes: the newest stored entry of each."""
        target_id = self.target_ids[url]
        out: dict[str, LogCursor] = {}
        with self.engine.connect() as conn:
            for log_name, model, key_column in (
                ("decisions", CompactionDecision, CompactionDecision.decision),
                ("audit", AuditEntry, AuditEntry.action),
                ("turns", Turn, Turn.outcome),
            ):
                row = conn.execute(
                    select(model.epoch, model.remote_id, model.ts, key_column)
                    .where(model.target_id == target_id, model.remote_id.is_not(None))
                    .order_by(model.epoch.desc(), model.remote_id.desc())
                    .limit(1)
                ).first()
                out[log_name] = (
                    LogCursor()
                    if row is None
                    else LogCursor(epoch=int(row[0]), after_id=int(row[1] or 0), ts=row[2], key=row[3])
                )
        return out

    def retention(
        self,
        raw_retention_s: float,
        rollup_retention_s: float,
        now: float | None = None,
        *,
        keep_alerts_s: float | None = None,
    ) -> tuple[int, int]:
        """`Rollups.retention`; it deletes old session and subtree rows, so their cached ids go too."""
        try:
            return super().retention(raw_retention_s, rollup_retention_s, now, keep_alerts_s=keep_alerts_s)
        finally:
            self._sessions.clear()
            self._subtrees.clear()

    # ------------------------------------------------------------------ heartbeat

    def heartbeat(
        self, *, targets: int, targets_up: int, config_path: str | None, info: dict[str, Any]
    ) -> None:
        now = self.clock()
        values = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_ts": self.started_ts,
            "last_beat_ts": now,
            "targets": targets,
            "targets_up": targets_up,
            "config_path": config_path,
            "info": info,
        }
        with self.engine.begin() as conn:
            if not conn.execute(
                update(CollectorHeartbeat).where(CollectorHeartbeat.name == self.name).values(**values)
            ).rowcount:
                conn.execute(insert(CollectorHeartbeat).values(name=self.name, **values))
