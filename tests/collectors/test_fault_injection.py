"""Fault injection against real HTTP targets: down, back, restart with reset counters, garbage, slow.

The collector runs in-process with a stepped clock (one step = one scrape interval) so every
phase is exact; the targets are real HTTP servers on loopback. Runs on SQLite and PostgreSQL.
"""

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


class Harness:
    def __init__(self, db_url: str, engine: FakeEngine, sidecar: FakeSidecar) -> None:
        self.clock = FakeClock()
        self.db = make_engine(db_url)
        upgrade(self.db)
        settings = AlertSettings(
            down_after_failures=2,
            down_for_s=0,
            up_for_s=0,
            stale_after_s=30,
            thin_reuse_for_s=2,
            thin_reuse_clear_s=2,
            compaction_hold_s=5,
        )
        config = CollectorConfig(
            engines=(EngineTarget(engine.url, name="fake"),),
            sidecars=(SidecarTarget(sidecar.url, engine=engine.url),),
            timeout_s=0.5,
            alerts=settings,
        )
        self.collector = Collector(config, self.db, clock=self.clock)
        self.engine, self.sidecar = engine, sidecar

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.clock.t += 1.0
            for url in list(self.collector.scrapers):
                self.collector.scrape_target(url)
            batch = []
            while not self.collector.queue.empty():
                batch.append(self.collector.queue.get_nowait())
            self.collector.process(batch)

    def values(self, signal: str, label: str = "0") -> list[tuple[float, float]]:
        with self.db.connect() as conn:
            return [
                (r.ts, r.value)
                for r in conn.execute(
                    select(Sample.ts, Sample.value)
                    .join(Series, Series.id == Sample.series_id)
                    .where(
                        Series.signal == signal,
                        Series.engine_label == label,
                        Series.target_id == self.collector.store.target_ids[self.engine.url],
                    )
                    .order_by(Sample.ts)
                )
            ]

    def target(self, url: str) -> dict:
        with self.db.connect() as conn:
            return queries.target_by_url(conn, url)

    def alerts(self, rule: str) -> list[dict]:
        with self.db.connect() as conn:
            return [a for a in queries.alerts(conn) if a["rule"] == rule]


@pytest.fixture
def harness(db_url):
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        h = Harness(db_url, engine, sidecar)
        yield h
        h.collector.client.close()
        h.db.dispose()


def test_down_back_restart_garbage_slow(harness):
    h = harness
    h.tick(3)
    assert h.values(sig.ENGINE_HIT_RATIO)[-1][1] == pytest.approx(0.8)
    kv_before = h.values(sig.KV_USAGE)[-1]

    # Down: connections refused. Recorded as down with the reason; the last good values stay.
    h.engine.stop()
    h.tick(3)
    target = h.target(h.engine.url)
    assert not target["up"] and "connection refused" in target["last_error"]
    assert target["consecutive_failures"] == 3
    assert h.values(sig.KV_USAGE)[-1] == kv_before
    assert [v for _, v in h.values(sig.UP, "")][-3:] == [0.0, 0.0, 0.0]
    down = h.alerts("target-down")
    assert len(down) == 1 and down[0]["state"] == "firing" and "connection refused" in down[0]["summary"]

    # Back on the same port.
    h.engine.start()
    h.tick(2)
    assert h.target(h.engine.url)["up"]
    assert h.alerts("target-down")[0]["state"] == "resolved"

    # Restart with reset counters: no rate for that interval, never negative, never a spike.
    n_ratio = len(h.values(sig.ENGINE_HIT_RATIO))
    h.engine.restart()
    h.tick(1)
    assert len(h.values(sig.ENGINE_HIT_RATIO)) == n_ratio
    h.tick(2)
    assert h.values(sig.ENGINE_HIT_RATIO)[-1][1] == pytest.approx(0.8)

    # Garbage, an HTML error page, NaN, then a slow target (timeout): failed scrapes with reasons.
    for mode, reason in (("garbage", "malformed"), ("html", "HTML page"), ("error500", "HTTP 500")):
        h.engine.mode = mode
        h.tick(1)
        target = h.target(h.engine.url)
        assert not target["up"] and reason in target["last_error"], mode
    h.engine.mode = "nan"
    h.tick(1)
    assert h.target(h.engine.url)["up"]
    h.engine.mode = "slow"
    h.engine.slow_s = 1.0
    h.tick(1)
    assert "timeout after 0.5 s" in h.target(h.engine.url)["last_error"]
    h.engine.mode = "ok"
    h.tick(3)
    assert h.target(h.engine.url)["up"]

    # Over the whole run: rates non-negative, ratios in [0, 1], no spike above the real rate.
    for name in (sig.PROMPT_TOKENS_PER_S, sig.CACHED_TOKENS_PER_S, sig.GENERATION_TOKENS_PER_S):
        assert all(v >= 0 for _, v in h.values(name)), name
    assert all(0 <= v <= 1 for _, v in h.values(sig.ENGINE_HIT_RATIO))
    # 1000 prompt tokens per scrape, one scrape per second (a gap may average, never exceed).
    rates = h.values(sig.PROMPT_TOKENS_PER_S)
    assert max(v for _, v in rates) <= 1000.0 + 1e-6, str([(t - 1800000000, v) for t, v in rates])
    assert all(a["rule"] != "stale-data" for a in h.alerts("stale-data"))


def test_sidecar_faults_and_thin_reuse_compaction_alerts(harness):
    h = harness
    h.tick(2)
    assert h.target(h.sidecar.url)["up"]
    h.sidecar.mode = "badjson"
    h.tick(1)
    sidecar = h.target(h.sidecar.url)
    assert not sidecar["up"] and "malformed JSON" in sidecar["last_error"]
    h.sidecar.mode = "ok"
    h.sidecar.divergence = 0.7
    h.tick(4)
    thin = h.alerts("thin-reuse")
    assert len(thin) == 1 and thin[0]["state"] == "firing" and thin[0]["values"]["divergence"] == 0.7
    h.sidecar.add_decision("granted", regime="thin-reuse")
    h.sidecar.add_decision("deferred", regime="thin-reuse")
    h.tick(1)
    grant = h.alerts("compaction-in-thin-reuse")
    assert len(grant) == 1 and grant[0]["severity"] == "critical"
    with h.db.connect() as conn:
        assert [d["decision"] for d in queries.compaction_decisions(conn)] == ["deferred", "granted"]
    h.sidecar.divergence = 0.1
    h.tick(8)
    assert h.alerts("thin-reuse")[0]["state"] == "resolved"
    assert h.alerts("compaction-in-thin-reuse")[0]["state"] == "resolved"


def test_sidecar_entries_survive_collector_restart_without_duplicates(harness):
    h = harness
    h.sidecar.add_audit("budgeter.update")
    h.sidecar.add_decision("granted")
    h.tick(2)
    # A new collector process on the same database, ten minutes later, starts from the stored cursors,
    # and its own downtime is not reported as the targets' stale data.
    h.collector.client.close()
    h.clock.t += 600.0
    second = Collector(h.collector.config, h.db, clock=h.clock)
    h.collector = second
    second.sweep_alerts()
    assert h.alerts("stale-data") == []
    h.sidecar.add_audit("park")
    h.tick(2)
    with h.db.connect() as conn:
        assert [a["action"] for a in queries.audit(conn, source="sidecar")] == ["park", "budgeter.update"]
        assert len(queries.compaction_decisions(conn)) == 1
    second.client.close()
