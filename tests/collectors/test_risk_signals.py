"""The collectors compute the collapse risk on every scrape and store it (the score and each input's
contribution) on the key it was judged for; a bare engine under KV pressure raises ``collapse-risk``.
Real HTTP targets on loopback, an in-process collector with a stepped clock (the fault-injection harness)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from collectors.config import CollectorConfig, EngineTarget, SidecarTarget
from collectors.service import Collector
from core import signals as sig
from core.alerts import AlertSettings
from db import make_engine, queries
from db.migrate import upgrade
from db.models import Sample, Series
from tests.collectors.fake_targets import FakeEngine, FakeSidecar
from tests.support import FakeClock


def run(db_url: str, config: CollectorConfig, ticks: int) -> tuple[Collector, object]:
    db = make_engine(db_url)
    upgrade(db)
    clock = FakeClock()
    collector = Collector(config, db, clock=clock)
    for _ in range(ticks):
        clock.t += 1.0
        for url in list(collector.scrapers):
            collector.scrape_target(url)
        batch = []
        while not collector.queue.empty():
            batch.append(collector.queue.get_nowait())
        collector.process(batch)
    collector.client.close()
    return collector, db


def stored(db, collector: Collector, url: str, signal: str, label: str) -> list[float]:
    with db.connect() as conn:
        return [
            r.value
            for r in conn.execute(
                select(Sample.value)
                .join(Series, Series.id == Sample.series_id)
                .where(
                    Series.signal == signal,
                    Series.engine_label == label,
                    Series.target_id == collector.store.target_ids[url],
                )
                .order_by(Sample.ts)
            )
        ]


def test_a_bare_engine_under_kv_pressure_stores_its_risk_and_warns(db_url):
    with FakeEngine() as engine:
        engine.kv_usage, engine.waiting = 0.99, 25.0
        config = CollectorConfig(
            engines=(EngineTarget(engine.url, name="bare"),),
            timeout_s=0.5,
            alerts=AlertSettings(risk_for_s=3),
        )
        collector, db = run(db_url, config, 8)
    risk = stored(db, collector, engine.url, sig.COLLAPSE_RISK, "0")
    # kv_usage 0.99 (+0.55 at kv_hi 0.95) and 25 requests waiting (+0.3 at queue_hi 20) from the first scrape;
    # missed prefill 1000-800 tokens/s is far under the prefill capacity
    assert len(risk) == 8 and risk == pytest.approx([0.85] * 8)
    assert stored(db, collector, engine.url, "risk_kv_usage", "0") == pytest.approx([0.55] * 8)
    assert stored(db, collector, engine.url, "risk_queue", "0") == pytest.approx([0.3] * 8)
    assert stored(db, collector, engine.url, "risk_kv_demand", "0") == []  # a sidecar input
    with db.connect() as conn:
        alerts = [a for a in queries.alerts(conn) if a["rule"] == "collapse-risk"]
    assert len(alerts) == 1 and alerts[0]["state"] == "firing" and alerts[0]["severity"] == "warning"
    assert "leading: kv_usage" in alerts[0]["summary"]
    db.dispose()


def test_a_sidecar_carries_the_risk_of_the_engine_it_fronts(db_url):
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        config = CollectorConfig(
            engines=(EngineTarget(engine.url, name="e"),),
            sidecars=(SidecarTarget(sidecar.url, engine=engine.url),),
            timeout_s=0.5,
        )
        collector, db = run(db_url, config, 4)
    risk = stored(db, collector, sidecar.url, sig.COLLAPSE_RISK, "")
    assert len(risk) == 4
    assert stored(db, collector, sidecar.url, "risk_kv_demand", "") == [0.0] * 4  # demand 0.5 of the pool
    assert stored(db, collector, engine.url, sig.COLLAPSE_RISK, "0") == []  # fronted: the sidecar judges
    db.dispose()
