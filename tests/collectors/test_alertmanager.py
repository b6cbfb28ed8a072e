"""collectors.alertmanager: [[alertmanagers]] config; POST /api/v2/alerts the way Prometheus does (unit,
with a mock transport and a stepped clock); and against a real Alertmanager 0.25 routing to a webhook
receiver: firing, visible in its API, delivered, resolved."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import insert

from collectors import prom_export
from collectors.alertmanager import AlertmanagerSender, AlertmanagerTarget, alert_payload
from collectors.config import CollectorConfig, ConfigError, EngineTarget, parse_config
from collectors.service import Collector
from core.alerts import AlertSettings
from db import make_engine
from db.migrate import upgrade
from db.models import Alert, Silence, Target
from tests.collectors.fake_targets import FakeEngine
from tests.collectors.promtools import alertmanager_server
from tests.support import FakeClock, free_port, wait_for

T0 = 1_800_000_000.0


def test_config_reads_alertmanagers_and_dashboard_url():
    config = parse_config(
        {
            "dashboard_url": "http://dash:8501/",
            "alertmanagers": [{"url": "http://am:9093/", "auth_header": "Bearer x", "resend_s": 30}],
        },
        "fleet.toml",
    )
    assert config.dashboard_url == "http://dash:8501"
    assert config.alertmanagers == (AlertmanagerTarget("http://am:9093", "Bearer x", 30.0, 5.0),)
    assert config.alertmanagers[0].headers == {"Authorization": "Bearer x"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"alertmanagers": [{"url": "am:9093"}]},
            r"fleet.toml alertmanagers\[0\]: url must be an http\(s\) URL, got 'am:9093'",
        ),
        (
            {"alertmanagers": [{"url": "http://am", "resend_s": 0}]},
            "resend_s must be a positive number of seconds, got 0",
        ),
        ({"alertmanagers": [{"url": "http://am", "token": "x"}]}, r"unknown key\(s\) \['token'\]"),
        ({"alertmanagers": {"url": "http://am"}}, r"\[\[alertmanagers\]\] must be an array of tables"),
        ({"dashboard_url": "dash"}, "fleet.toml dashboard_url: url must be an http"),
    ],
)
def test_config_errors_name_the_entry_and_value(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(data, "fleet.toml")


@pytest.fixture
def db(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'am.db'}")
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(Target).values(
                id=1, url="http://10.0.0.5:8000", role="engine", name="gpu-a/0", created_ts=T0
            )
        )
        conn.execute(
            insert(Target).values(
                id=2,
                url="http://10.0.0.5:8100",
                role="sidecar",
                name=None,
                engine_url="http://10.0.0.5:8000",
                created_ts=T0,
            )
        )
    yield engine
    engine.dispose()


def _fire(
    db, alert_id: int, rule: str, target_id: int, ts: float, *, label: str = "", silenced: bool = False
):
    with db.begin() as conn:
        conn.execute(
            insert(Alert).values(
                id=alert_id,
                rule=rule,
                target_id=target_id,
                engine_label=label,
                severity="critical",
                state="firing",
                started_ts=ts,
                summary=f"{rule} now",
                values={},
                silenced=silenced,
            )
        )


def _resolve(db, alert_id: int, ts: float):
    with db.begin() as conn:
        conn.execute(
            Alert.__table__.update().where(Alert.id == alert_id).values(state="resolved", resolved_ts=ts)
        )


def _sender(db, clock, status=200):
    posts: list[tuple[dict[str, str], list[dict[str, Any]]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append((dict(request.headers), json.loads(request.content)))
        assert request.url.path == "/api/v2/alerts"
        return httpx.Response(status)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    return AlertmanagerSender(db, client, clock=clock), posts


AM = (AlertmanagerTarget("http://am:9093", auth_header="Bearer t0k", resend_s=60),)


def test_firing_is_resent_while_it_fires_and_ended_on_resolve(db):
    clock = FakeClock(T0)
    sender, posts = _sender(db, clock)
    _fire(db, 7, "collapse", 2, T0 - 10)
    assert sender.tick(AM, "http://dash:8501") == 1
    headers, [alert] = posts[-1]
    assert headers["authorization"] == "Bearer t0k"
    assert alert["labels"] == {
        "alertname": "PrefixOpsCollapse",
        "rule": "collapse",
        "severity": "critical",
        "service": "prefixops",
        "instance": "10.0.0.5:8100",
        "target": "http://10.0.0.5:8100",
        "role": "sidecar",
    }
    assert alert["startsAt"] == "2027-01-15T07:59:50.000Z"
    assert alert["endsAt"] == "2027-01-15T08:04:00.000Z"  # now + 4 x resend_s: lapses if the collectors stop
    # generatorURL opens the fronted engine's page at the alert's start
    assert alert["generatorURL"] == f"http://dash:8501/engine?engine=gpu-a%2F0&at={T0 - 10:.0f}&range=1h"
    assert alert["annotations"]["runbook_url"] == "docs/runbook.md#collapse"
    assert alert["annotations"]["dashboard_url"] == "http://dash:8501/budgeter?engine=gpu-a%2F0"

    clock.t += 30
    assert sender.tick(AM, "http://dash:8501") == 0  # not due yet
    clock.t += 30
    assert sender.tick(AM, "http://dash:8501") == 1  # re-sent with the same labels
    assert posts[-1][1][0]["labels"] == alert["labels"]

    _resolve(db, 7, clock.t + 1)
    clock.t += 2
    assert sender.tick(AM, None) == 1
    ended = posts[-1][1][0]
    assert ended["labels"] == alert["labels"] and ended["endsAt"] == "2027-01-15T08:01:01.000Z"
    clock.t += 60
    assert sender.tick(AM, None) == 1  # the end is repeated for a while, in case one POST was lost
    clock.t += 400
    sender.tick(AM, None)
    assert sender.sent["http://am:9093"] == {}


def test_failed_posts_are_retried_at_the_next_tick(db):
    clock = FakeClock(T0)
    sender, posts = _sender(db, clock, status=503)
    _fire(db, 1, "target-down", 1, T0)
    assert sender.tick(AM, None) == 0 and len(posts) == 1
    clock.t += 1
    assert sender.tick(AM, None) == 0 and len(posts) == 2  # retried, not waiting for resend_s


def test_prefixops_silences_keep_alerts_from_alertmanager(db):
    clock = FakeClock(T0)
    sender, posts = _sender(db, clock)
    _fire(db, 1, "thin-reuse", 2, T0, silenced=True)  # fired under a silence: never sent
    _fire(db, 2, "admission-wait", 2, T0)
    assert sender.tick(AM, None) == 1 and posts[-1][1][0]["labels"]["rule"] == "admission-wait"
    with db.begin() as conn:  # a silence set now on admission-wait: the alert is ended in Alertmanager
        conn.execute(
            insert(Silence).values(
                rule="admission-wait",
                target_id=None,
                starts_ts=T0,
                ends_ts=T0 + 100,
                created_ts=T0,
                created_by="op",
                comment="maintenance",
            )
        )
    clock.t += 1
    assert sender.tick(AM, None) == 1
    assert posts[-1][1][0]["endsAt"] == "2027-01-15T08:00:01.000Z"
    clock.t += 200  # the silence is over and the alert still fires: sent again
    assert sender.tick(AM, None) == 1
    assert posts[-1][1][0]["endsAt"] > "2027-01-15T08:03:21"


def test_payload_of_an_engine_label_alert():
    target = {"url": "http://e:8000", "role": "engine", "name": None}
    doc = alert_payload(
        {"rule": "collapse", "severity": "critical", "engine_label": "0", "started_ts": T0, "summary": "s"},
        target,
        {},
        dashboard_url=None,
        ends_ts=T0 + 1,
    )
    assert (
        doc["labels"]["engine"] == "0" and doc["labels"]["instance"] == "e:8000" and doc["generatorURL"] == ""
    )


# ------------------------------------------------------------------ a real Alertmanager


class Receiver:
    """A loopback webhook receiver: every POSTed body, parsed."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                owner.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def statuses(self, alertname: str) -> list[str]:
        return [
            a["status"] for b in self.bodies for a in b["alerts"] if a["labels"]["alertname"] == alertname
        ]


def test_real_alertmanager_receives_routes_and_resolves(tmp_path):
    receiver = Receiver()
    am_config = {
        "route": {
            "receiver": "hook",
            "group_by": ["alertname", "instance"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "hook", "webhook_configs": [{"url": receiver.url, "send_resolved": True}]}],
        **prom_export.inhibit_rules(),
    }
    db = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    upgrade(db)
    try:
        with alertmanager_server(yaml.safe_dump(am_config)) as am_url, FakeEngine() as engine:
            config = CollectorConfig(
                engines=(EngineTarget(engine.url, name="fake"),),
                timeout_s=0.5,
                alerts=AlertSettings(down_after_failures=2, down_for_s=0, up_for_s=0),
                alertmanagers=(AlertmanagerTarget(am_url, resend_s=2),),
                dashboard_url="http://dash:8501",
            )
            collector = Collector(config, db)

            def step() -> None:
                collector.scrape_target(engine.url)
                batch = []
                while not collector.queue.empty():
                    batch.append(collector.queue.get_nowait())
                collector.process(batch)
                collector._send_alertmanagers()

            step()
            engine.stop()
            for _ in range(3):
                step()
                time.sleep(0.2)

            def in_api():
                alerts = httpx.get(f"{am_url}/api/v2/alerts").json()
                return [a for a in alerts if a["labels"].get("alertname") == "PrefixOpsTargetDown"]

            [seen] = wait_for(in_api, what="the alert in Alertmanager's API")
            assert seen["labels"]["rule"] == "target-down" and seen["labels"]["service"] == "prefixops"
            assert seen["generatorURL"] == (
                f"http://dash:8501/engine?engine=fake&at="
                f"{seen['generatorURL'].split('at=')[1].split('&')[0]}&range=1h"
            )
            assert seen["status"]["state"] == "active"
            wait_for(
                lambda: "firing" in receiver.statuses("PrefixOpsTargetDown"), what="the firing notification"
            )

            engine.start()
            for _ in range(3):
                step()
                time.sleep(0.2)
            wait_for(
                lambda: "resolved" in receiver.statuses("PrefixOpsTargetDown"),
                what="the resolved notification",
            )
            assert not [a for a in in_api() if a["status"]["state"] == "active"]
            collector.client.close()
    finally:
        receiver.httpd.shutdown()
        db.dispose()
