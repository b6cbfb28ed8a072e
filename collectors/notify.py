"""Alert notifications through an outbox: rows in ``notifications`` are POSTed to webhooks.

- `queue` adds one outbox row per (alert, event, webhook) in the same transaction that
  changes the alert, so a crash cannot lose or double a notification; the unique key
  ``(alert_id, event, webhook_url)`` makes queueing idempotent and the restart-time
  restore of firing alerts means a restarted collector queues nothing twice.
- `Notifier.deliver_due` POSTs due rows (each carries an ``Idempotency-Key`` header:
  ``prefixops-<alert id>-<event>``), marks them sent on a 2xx, else retries with exponential
  backoff (2 s, 4 s, ... capped at 5 min) up to the webhook's ``max_attempts``, then gives up
  (``failed``) and logs one line.
- Silenced alerts queue nothing. An alert acknowledged on the dashboard gets an
  ``acknowledged`` notification (`queue_acknowledgements`).

Payload formats: ``json`` (PrefixOps' own, documented in docs/collectors.md) and
``alertmanager`` (the Alertmanager webhook format, version 4, one alert per message).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from sqlalchemy import Connection, Engine, and_, insert, select, update

from collectors.config import Webhook
from db.models import Alert, Notification, Target

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 300.0


def _iso(ts: float | None) -> str:
    if ts is None:
        return "0001-01-01T00:00:00Z"
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def _alert_doc(conn: Connection, alert_id: int) -> dict[str, Any] | None:
    row = conn.execute(
        select(
            *Alert.__table__.columns,
            Target.url.label("target_url"),
            Target.name.label("target_name"),
            Target.kind.label("target_kind"),
        )
        .outerjoin(Target, Target.id == Alert.target_id)
        .where(Alert.id == alert_id)
    ).first()
    if row is None:
        return None
    a = row._mapping
    return {
        "id": a["id"],
        "rule": a["rule"],
        "severity": a["severity"],
        "state": a["state"],
        "target": a["target_url"],
        "target_name": a["target_name"],
        "kind": a["target_kind"],
        "engine": a["engine_label"] or None,
        "summary": a["summary"],
        "values": a["values"],
        "started_ts": a["started_ts"],
        "resolved_ts": a["resolved_ts"],
        "acknowledged_by": a["acknowledged_by"],
        "acknowledged_ts": a["acknowledged_ts"],
    }


def json_payload(alert: dict[str, Any], event: str) -> dict[str, Any]:
    return {"version": "prefixops/1", "event": event, "alert": alert}


def alertmanager_payload(alert: dict[str, Any], event: str) -> dict[str, Any]:
    """Alertmanager webhook (version 4) message carrying this one alert."""
    status = "resolved" if event == "resolved" else "firing"
    labels = {
        "alertname": alert["rule"],
        "severity": alert["severity"],
        "instance": alert["target"] or "",
        "service": "prefixops",
    }
    if alert.get("engine"):
        labels["engine"] = alert["engine"]
    if alert.get("target_name"):
        labels["target_name"] = alert["target_name"]
    annotations = {"summary": alert["summary"], "values": str(alert.get("values") or {})}
    if event == "acknowledged":
        annotations["acknowledged_by"] = str(alert.get("acknowledged_by") or "")
    fingerprint = f"{alert['id']:016x}"
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{alert["rule"]}", instance="{labels["instance"]}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "prefixops",
        "groupLabels": {"alertname": alert["rule"]},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": [
            {
                "status": status,
                "labels": labels,
                "annotations": annotations,
                "startsAt": _iso(alert["started_ts"]),
                "endsAt": _iso(alert["resolved_ts"]) if status == "resolved" else "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": fingerprint,
            }
        ],
    }


def build_payload(alert: dict[str, Any], event: str, fmt: str) -> dict[str, Any]:
    return alertmanager_payload(alert, event) if fmt == "alertmanager" else json_payload(alert, event)


def queue(conn: Connection, alert_id: int, event: str, webhooks: Sequence[Webhook], *, now: float) -> int:
    """Queue `event` of an alert for every webhook (nothing for a silenced alert). Returns rows added."""
    if not webhooks:
        return 0
    silenced = conn.execute(select(Alert.silenced).where(Alert.id == alert_id)).scalar()
    if silenced:
        return 0
    alert = _alert_doc(conn, alert_id)
    if alert is None:
        return 0
    existing = set(
        conn.execute(
            select(Notification.webhook_url).where(
                Notification.alert_id == alert_id, Notification.event == event
            )
        ).scalars()
    )
    rows = [
        {
            "alert_id": alert_id,
            "event": event,
            "webhook_url": w.url,
            "payload_format": w.format,
            "payload": build_payload(alert, event, w.format),
            "created_ts": now,
            "attempts": 0,
            "next_attempt_ts": now,
            "failed": False,
        }
        for w in webhooks
        if w.url not in existing
    ]
    if rows:
        conn.execute(insert(Notification), rows)
    return len(rows)


def queue_acknowledgements(engine: Engine, webhooks: Sequence[Webhook], *, now: float) -> int:
    """Queue an ``acknowledged`` notification for alerts acknowledged since (dashboard writes)."""
    if not webhooks:
        return 0
    added = 0
    with engine.begin() as conn:
        acked = (
            conn.execute(
                select(Alert.id)
                .where(Alert.acknowledged_ts.is_not(None), Alert.silenced.is_(False))
                .where(
                    ~select(Notification.id)
                    .where(and_(Notification.alert_id == Alert.id, Notification.event == "acknowledged"))
                    .exists()
                )
            )
            .scalars()
            .all()
        )
        for alert_id in acked:
            added += queue(conn, alert_id, "acknowledged", webhooks, now=now)
    return added


class Notifier:
    """Delivers due outbox rows. `deliver_due` does HTTP, then hands result updates to `write`."""

    def __init__(
        self, engine: Engine, client: httpx.Client, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.engine = engine
        self.client = client
        self.clock = clock
        self.in_flight: set[int] = set()

    def due(self, limit: int = 100) -> list[Any]:
        now = self.clock()
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(*Notification.__table__.columns)
                .where(
                    Notification.sent_ts.is_(None),
                    Notification.failed.is_(False),
                    Notification.next_attempt_ts <= now,
                )
                .order_by(Notification.id)
                .limit(limit)
            ).all()
        return [r for r in rows if r.id not in self.in_flight]

    def deliver_due(
        self, webhooks: Sequence[Webhook], write: Callable[[Callable[[], None]], None] | None = None
    ) -> int:
        """POST every due notification once; returns how many were delivered."""
        by_url = {w.url: w for w in webhooks}
        delivered = 0
        for row in self.due():
            hook = by_url.get(row.webhook_url)
            max_attempts = hook.max_attempts if hook else 1
            timeout = hook.timeout_s if hook else 5.0
            headers = {
                "Idempotency-Key": f"prefixops-{row.alert_id}-{row.event}",
                **(hook.headers if hook else {}),
            }
            self.in_flight.add(row.id)
            error: str | None = None
            try:
                response = self.client.post(
                    row.webhook_url, json=row.payload, timeout=timeout, headers=headers
                )
                if not 200 <= response.status_code < 300:
                    error = f"HTTP {response.status_code}: {response.text[:120]!r}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            now = self.clock()
            attempts = row.attempts + 1
            if error is None:
                delivered += 1
                values: dict[str, Any] = {"sent_ts": now, "attempts": attempts, "last_error": None}
            else:
                gave_up = attempts >= max_attempts or hook is None
                values = {
                    "attempts": attempts,
                    "last_error": error[:2000],
                    "failed": gave_up,
                    "next_attempt_ts": now + min(MAX_BACKOFF_S, 2.0**attempts),
                }
                if gave_up:
                    log.error(
                        "webhook %s: giving up on alert %s %s after %d attempts: %s",
                        row.webhook_url,
                        row.alert_id,
                        row.event,
                        attempts,
                        error,
                    )
                else:
                    log.warning(
                        "webhook %s: attempt %d failed (%s); retrying", row.webhook_url, attempts, error
                    )
            row_id = row.id

            def apply(row_id: int = row_id, values: dict[str, Any] = values) -> None:
                with self.engine.begin() as conn:
                    conn.execute(update(Notification).where(Notification.id == row_id).values(**values))
                self.in_flight.discard(row_id)

            if write is None:
                apply()
            else:
                write(apply)
        return delivered
