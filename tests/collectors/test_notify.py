"""Alert lifecycle and webhooks: outbox, retries, Alertmanager payload, silences, acks, no duplicate on restart."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import func, select

from collectors.config import CollectorConfig, EngineTarget, Webhook
from collectors.service import Collector
from core.alerts import AlertSettings
from db import make_engine, queries
from db.migrate import upgrade
from db.models import Alert, Notification
from tests.support import FakeClock

DOWN_URL = "http://127.0.0.1:9"  # nothing listens on the discard port: connection refused


class Receiver:
    """A webhook endpoint that records POSTs and fails the first `fail` of them with HTTP 503."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.posts: list[tuple[dict, dict]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if owner.fail > 0:
                    owner.fail -= 1
                    self.send_response(503)
                else:
                    owner.posts.append((body, dict(self.headers)))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def make_collector(db, receiver_url: str, clock: FakeClock, fmt: str = "json") -> Collector:
    config = CollectorConfig(
        engines=(EngineTarget(DOWN_URL, name="gone"),),
        webhooks=(Webhook(receiver_url, format=fmt, max_attempts=3),),
        alerts=AlertSettings(down_after_failures=2, down_for_s=0, up_for_s=0),
    )
    return Collector(config, db, clock=clock)


def tick(c: Collector, clock: FakeClock, n: int = 1) -> None:
    for _ in range(n):
        clock.t += 1.0
        outcomes = [s.scrape(c.client) for s in c.scrapers.values()]
        c.process(outcomes)


def outbox_count(db) -> int:
    with db.connect() as conn:
        return conn.execute(select(func.count()).select_from(Notification)).scalar()


def test_firing_notification_retries_then_no_duplicate_after_restart(db_url, receiver):
    db = make_engine(db_url)
    upgrade(db)
    clock = FakeClock()
    c = make_collector(db, receiver.url, clock, fmt="alertmanager")
    receiver.fail = 1
    tick(c, clock, 3)
    assert outbox_count(db) == 1
    assert c.notifier.deliver_due(c.config.webhooks) == 0  # 503: retried later, not lost
    with db.connect() as conn:
        row = conn.execute(
            select(Notification.attempts, Notification.last_error, Notification.next_attempt_ts)
        ).one()
    assert row.attempts == 1 and "HTTP 503" in row.last_error and row.next_attempt_ts == clock.t + 2.0
    assert c.notifier.deliver_due(c.config.webhooks) == 0  # not due yet
    clock.t += 2.0
    assert c.notifier.deliver_due(c.config.webhooks) == 1
    body, headers = receiver.posts[0]
    assert body["version"] == "4" and body["status"] == "firing"
    alert = body["alerts"][0]
    assert alert["labels"]["alertname"] == "target-down" and alert["labels"]["instance"] == DOWN_URL
    assert (
        alert["labels"]["severity"] == "critical" and "connection refused" in alert["annotations"]["summary"]
    )
    assert alert["startsAt"].endswith("Z") and headers["Idempotency-Key"].startswith("prefixops-")
    c.client.close()

    # A restarted collector on the same database: the alert is still the same one, nothing resent.
    c2 = make_collector(db, receiver.url, clock, fmt="alertmanager")
    tick(c2, clock, 3)
    c2.notifier.deliver_due(c2.config.webhooks)
    with db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Alert)).scalar() == 1
    assert outbox_count(db) == 1 and len(receiver.posts) == 1
    c2.client.close()


def test_resolved_and_acknowledged_notifications_and_silences(db_url, receiver):
    db = make_engine(db_url)
    upgrade(db)
    clock = FakeClock()
    c = make_collector(db, receiver.url, clock)
    tick(c, clock, 3)
    with db.connect() as conn:
        alert_id = queries.open_alerts(conn)[0]["id"]
    assert queries.acknowledge_alert(db, alert_id, by="alice", ts=clock.t)
    assert not queries.acknowledge_alert(db, alert_id, by="bob", ts=clock.t)  # already acknowledged
    c.maintenance()  # queues the acknowledgement
    # The target comes back: resolve it by swapping in a config whose engine answers (none: drop it).
    c.evaluator.observe_scrape(DOWN_URL, clock.t + 1, True)
    c.sweep_alerts()
    c.notifier.deliver_due(c.config.webhooks)
    events = [body["event"] for body, _ in receiver.posts]
    assert events == ["firing", "acknowledged", "resolved"]
    assert receiver.posts[1][0]["alert"]["acknowledged_by"] == "alice"
    with db.connect() as conn:
        alert = queries.alerts(conn)[0]
    assert (
        alert["state"] == "resolved"
        and alert["resolved_ts"] is not None
        and alert["acknowledged_by"] == "alice"
    )

    # A silence on the rule: the next episode is recorded but nobody is paged.
    target_id = c.store.target_ids[DOWN_URL]
    queries.add_silence(db, rule="target-down", target_id=target_id, duration_s=3600, by="alice", now=clock.t)
    tick(c, clock, 3)
    c.notifier.deliver_due(c.config.webhooks)
    with db.connect() as conn:
        episodes = queries.alerts(conn)
    assert [a["state"] for a in episodes] == ["firing", "resolved"] and episodes[0]["silenced"]
    assert len(receiver.posts) == 3
    c.client.close()


def test_webhook_gives_up_after_max_attempts(tmp_path):
    db = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    upgrade(db)
    clock = FakeClock()
    c = make_collector(db, "http://127.0.0.1:9/hook", clock)  # nothing listens there
    tick(c, clock, 3)
    for _ in range(3):
        clock.t += 10.0
        c.notifier.deliver_due(c.config.webhooks)
    with db.connect() as conn:
        row = conn.execute(select(Notification.attempts, Notification.failed, Notification.sent_ts)).one()
    assert row.attempts == 3 and row.failed and row.sent_ts is None
    c.client.close()
