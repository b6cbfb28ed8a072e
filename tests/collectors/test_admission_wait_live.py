"""`admission-wait` on a real sidecar queue: a session holds the pool above the low band, a new session waits
for admission, the collectors read `backlog.oldest_waiting_s` and the alert fires; ending the first session
admits the second and the alert resolves."""

from __future__ import annotations

import threading
import time

import httpx

from collectors.config import CollectorConfig, SidecarTarget
from collectors.service import Collector
from core.alerts import AlertSettings
from db import make_engine, queries
from db.migrate import upgrade
from tests.support import simulator_and_sidecar


def test_admission_wait_fires_on_a_real_queue_and_resolves(tmp_path):
    db = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    upgrade(db)
    with simulator_and_sidecar(tmp_path, sidecar_args=("--pool-tokens", "8000")) as (engine_url, sidecar_url):
        model = httpx.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["id"]
        client = httpx.Client(base_url=sidecar_url, timeout=120)
        big = (
            "Every line of this report matters to the reader. " * 520
        )  # ~6,400 tokens: demand above the low band (6,000)
        r = client.post(
            "/v1/completions",
            headers={"X-Session-Id": "big"},
            json={"model": model, "prompt": big, "max_tokens": 8},
        )
        assert r.status_code == 200, r.text
        results: list[int] = []
        waiter = threading.Thread(
            target=lambda: results.append(
                client.post(
                    "/v1/completions",
                    headers={"X-Session-Id": "late"},
                    json={"model": model, "prompt": "A short question.", "max_tokens": 4},
                ).status_code
            ),
            daemon=True,
        )
        waiter.start()
        settings = AlertSettings(admission_wait_s=2, admission_wait_for_s=0, admission_wait_clear_s=0)
        collector = Collector(
            CollectorConfig(sidecars=(SidecarTarget(sidecar_url),), timeout_s=5.0, alerts=settings), db
        )

        def step() -> list[dict]:
            collector.scrape_target(sidecar_url)
            batch = []
            while not collector.queue.empty():
                batch.append(collector.queue.get_nowait())
            collector.process(batch)
            with db.connect() as conn:
                return [a for a in queries.alerts(conn) if a["rule"] == "admission-wait"]

        deadline = time.monotonic() + 30
        alerts = step()
        while not alerts and time.monotonic() < deadline:
            time.sleep(0.5)
            alerts = step()
        assert alerts and alerts[0]["state"] == "firing", alerts
        assert alerts[0]["values"]["oldest_waiting_s"] >= 2 and alerts[0]["values"]["waiting"] == 1
        assert not results, "the late session must still be waiting while the alert fires"

        assert client.delete("/sessions/big").status_code in (200, 204)
        waiter.join(timeout=30)
        assert results == [200]
        deadline = time.monotonic() + 30
        while alerts[0]["state"] == "firing" and time.monotonic() < deadline:
            time.sleep(0.5)
            alerts = step()
        assert alerts[0]["state"] == "resolved"
        collector.client.close()
        client.close()
    db.dispose()
