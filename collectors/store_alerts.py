"""The store's alert rows: opening and resolving alerts, silences, and queueing their notifications.

A mixin of `collectors.store.Store`, run on the writer thread. A transition of the evaluator
(`core.alerts.Transition`) opens a firing alert row once per rule, target and engine label, or
resolves the open one; each queues its notifications in the outbox (`collectors.notify`) in the
same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import Connection, Engine, func, insert, select, update

from collectors import notify
from collectors.config import CollectorConfig
from core.alerts import Transition
from db.models import Alert, Silence, Target

log = logging.getLogger(__name__)


class AlertRows:
    engine: Engine
    target_ids: dict[str, int]

    def open_alert_keys(self) -> list[tuple[str, str, str]]:
        """(rule, target URL, engine label) of every firing alert (restored into the evaluator at start)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(Alert.rule, Target.url, Alert.engine_label)
                .join(Target, Target.id == Alert.target_id)
                .where(Alert.state == "firing")
            ).all()
        return [(r.rule, r.url, r.engine_label) for r in rows]

    def silenced(self, conn: Connection, rule: str, target_id: int | None, now: float) -> bool:
        stmt = (
            select(func.count())
            .select_from(Silence)
            .where(
                Silence.starts_ts <= now,
                Silence.ends_ts > now,
                (Silence.rule.is_(None)) | (Silence.rule == rule),
                (Silence.target_id.is_(None)) | (Silence.target_id == target_id),
            )
        )
        return bool(conn.execute(stmt).scalar())

    def apply_transitions(self, transitions: Sequence[Transition], config: CollectorConfig) -> list[int]:
        """Open/close alert rows and queue notifications; returns the ids of alerts touched."""
        if not transitions:
            return []
        touched: list[int] = []
        with self.engine.begin() as conn:
            for t in transitions:
                url, label = t.key
                tid = self.target_ids.get(url)
                if t.event == "firing":
                    already = conn.execute(
                        select(Alert.id).where(
                            Alert.rule == t.rule,
                            Alert.target_id == tid,
                            Alert.engine_label == label,
                            Alert.state == "firing",
                        )
                    ).scalar()
                    if already is not None:
                        continue
                    silenced = self.silenced(conn, t.rule, tid, t.ts)
                    alert_id = conn.execute(
                        insert(Alert)
                        .values(
                            rule=t.rule,
                            target_id=tid,
                            engine_label=label,
                            severity=t.severity,
                            state="firing",
                            started_ts=t.ts,
                            last_eval_ts=t.ts,
                            summary=t.summary,
                            values=t.values,
                            silenced=silenced,
                        )
                        .returning(Alert.id)
                    ).scalar_one()
                    log.warning(
                        "alert firing: %s on %s%s: %s",
                        t.rule,
                        url,
                        f" engine {label}" if label else "",
                        t.summary,
                    )
                else:
                    open_id = conn.execute(
                        select(Alert.id)
                        .where(
                            Alert.rule == t.rule,
                            Alert.target_id == tid,
                            Alert.engine_label == label,
                            Alert.state == "firing",
                        )
                        .order_by(Alert.started_ts.desc())
                    ).scalar()
                    if open_id is None:
                        continue
                    alert_id = open_id
                    conn.execute(
                        update(Alert)
                        .where(Alert.id == alert_id)
                        .values(state="resolved", resolved_ts=t.ts, last_eval_ts=t.ts)
                    )
                    log.info("alert resolved: %s on %s%s", t.rule, url, f" engine {label}" if label else "")
                touched.append(alert_id)
                notify.queue(conn, alert_id, t.event, config.webhooks, now=t.ts)
        return touched

    def resolve_alerts_of_removed_targets(self, now: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(Alert)
                .where(
                    Alert.state == "firing",
                    Alert.target_id.in_(select(Target.id).where(Target.configured.is_(False))),
                )
                .values(
                    state="resolved",
                    resolved_ts=now,
                    summary=Alert.summary + " (target removed from the configuration)",
                )
            )
