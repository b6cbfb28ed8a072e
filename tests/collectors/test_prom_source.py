"""collectors.prom_source: engines read from a Prometheus query API. Unit tests with a mock API (one query
per family, engines as targets, up == 0, resets, errors), and a real Prometheus scraping a synthetic fleet
(bench/fleet_exporter.py) read by the collector into the database."""

from __future__ import annotations

import json
import time
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from sqlalchemy import select

from collectors.config import CollectorConfig, EngineTarget
from collectors.prom_source import FAMILIES, PromSource, selector
from collectors.service import Collector
from core import signals as sig
from db import make_engine
from db.migrate import upgrade
from db.models import Sample, Series, Target
from tests.collectors.promtools import prometheus_server
from tests.support import PYTHON, REPO, free_port, running

PROM = "http://prom:9090"


class FakeAPI:
    """Answers instant queries from a table of series: {metric name: [(labels, value)]}."""

    def __init__(self) -> None:
        self.series: dict[str, list[tuple[dict[str, str], float]]] = {}
        self.queries: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.fail = False

    def engine(
        self,
        instance: str,
        *,
        queries: float,
        hits: float,
        start: float = 1000.0,
        up: float = 1.0,
        ts: float = 0.0,
    ) -> None:
        base = {"job": "vllm", "instance": instance}
        eng = {**base, "engine": "0", "model_name": "m"}
        for name, labels, value in (
            ("up", base, up),
            ("vllm:prefix_cache_queries_total", eng, queries),
            ("vllm:prefix_cache_hits_total", eng, hits),
            ("vllm:num_requests_running", eng, 3.0),
            ("vllm:num_requests_waiting", eng, 1.0),
            ("vllm:kv_cache_usage_perc", eng, 0.4),
            ("process_start_time_seconds", base, start),
            ("timestamp", eng, ts),
        ):
            rows = [r for r in self.series.get(name, []) if r[0].get("instance") != instance]
            if name != "up" and up < 1:
                self.series[name] = rows  # a target Prometheus cannot scrape has no fresh series
                continue
            self.series[name] = rows + [(dict(labels), value)]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        query = parse_qs(urlsplit(str(request.url)).query)["query"][0]
        self.queries.append(query)
        self.headers.append(dict(request.headers))
        if self.fail:
            return httpx.Response(503, text="overloaded")
        if query.startswith("timestamp("):
            rows = self.series.get("timestamp", [])
        else:
            names = (
                query.split('__name__=~"')[1].split('"')[0].split("|")
                if "__name__=~" in query
                else [query.split('__name__="')[1].split('"')[0]]
            )
            rows = [({"__name__": n, **labels}, v) for n in names for labels, v in self.series.get(n, [])]
        result = [{"metric": labels, "value": [0, str(v)]} for labels, v in rows]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )


def _source(api: FakeAPI, clock) -> PromSource:
    target = EngineTarget(PROM, kind="prometheus", matchers='job="vllm"', auth_header="Bearer t")
    return PromSource(target, interval_s=1.0, timeout_s=1.0, clock=clock)


def test_selector_carries_the_matchers():
    assert selector(("up",), 'job="vllm"') == '{__name__="up", job="vllm"}'
    assert selector(("a", "b"), "") == '{__name__=~"a|b"}'


def test_one_query_per_family_and_every_engine_an_outcome():
    api, now = FakeAPI(), [100.0]
    api.engine("10.0.0.1:8000", queries=1000, hits=800, ts=99.0)
    api.engine("10.0.0.2:8000", queries=1000, hits=500, ts=99.0)
    client = httpx.Client(transport=httpx.MockTransport(api))
    source = _source(api, lambda: now[0])
    first = source.scrape(client)
    assert len(api.queries) == len(FAMILIES) + 3  # up, scrape time, families, process start
    assert all('job="vllm"' in q for q in api.queries) and api.headers[0]["authorization"] == "Bearer t"
    assert [o.url for o in first] == [PROM, "http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert all(o.ok for o in first)
    values = dict(((o.url, name), v) for o in first for _, name, v in o.samples)
    assert values[("http://10.0.0.1:8000", sig.KV_USAGE)] == 0.4
    assert values[("http://10.0.0.1:8000", sig.REQUESTS_RUNNING)] == 3.0
    assert ("http://10.0.0.1:8000", sig.ENGINE_HIT_RATIO) not in values  # one reading: no rate yet

    api.engine("10.0.0.1:8000", queries=2000, hits=1800, ts=100.0)  # +1000 queries, +1000 hits
    api.engine("10.0.0.2:8000", queries=1000, hits=500, ts=99.0)  # no new Prometheus scrape
    now[0] = 101.0
    second = source.scrape(client)
    assert [o.url for o in second] == [PROM, "http://10.0.0.1:8000"]
    rates = {name: v for _, name, v in second[1].samples}
    assert rates[sig.ENGINE_HIT_RATIO] == 1.0 and rates[sig.PREFIX_CACHE_QUERIES_PER_S] == 1000.0
    assert second[1].ts == 100.0  # the engine's own scrape time

    # A restart (new process start) gives no rate for that interval, as when scraping.
    api.engine("10.0.0.1:8000", queries=10, hits=5, start=2000.0, ts=101.0)
    now[0] = 102.0
    third = source.scrape(client)
    assert sig.ENGINE_HIT_RATIO not in {name for _, name, _ in third[1].samples}
    assert third[1].restarted


def test_up_zero_is_a_failed_scrape_and_api_errors_fail_the_source():
    api, now = FakeAPI(), [100.0]
    api.engine("10.0.0.1:8000", queries=1000, hits=800, ts=99.0)
    client = httpx.Client(transport=httpx.MockTransport(api))
    source = _source(api, lambda: now[0])
    source.scrape(client)
    api.engine("10.0.0.1:8000", queries=1000, hits=800, up=0.0)
    down = source.scrape(client)
    assert not down[1].ok and "reports up == 0 for 10.0.0.1:8000" in down[1].error
    api.fail = True
    [failed] = source.scrape(client)
    assert failed.url == PROM and not failed.ok and "HTTP 503" in failed.error


# ------------------------------------------------------------------ a real Prometheus


def test_collector_reads_a_synthetic_fleet_through_a_real_prometheus(tmp_path):
    exporter_port = free_port()
    config_yaml = json.dumps(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "vllm",
                    "honor_labels": True,
                    "scrape_interval": "1s",
                    "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
                }
            ],
        }
    )
    exporter = [
        PYTHON,
        str(REPO / "bench" / "fleet_exporter.py"),
        "--port",
        str(exporter_port),
        "--engines",
        "3",
    ]
    db = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    upgrade(db)
    with (
        running(
            exporter, name="fleet-exporter", ready_url=f"http://127.0.0.1:{exporter_port}/engine/0/metrics"
        ),
        prometheus_server(config_yaml) as prom_url,
    ):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = httpx.get(
                f"{prom_url}/api/v1/query", params={"query": "vllm:num_requests_running"}
            ).json()
            if len(found["data"]["result"]) == 3:
                break
            time.sleep(0.5)
        config = CollectorConfig(
            engines=(EngineTarget(prom_url, kind="prometheus", matchers='job="vllm"'),),
            interval_s=1.0,
            timeout_s=5.0,
        )
        collector = Collector(config, db)
        for _ in range(6):
            collector.scrape_target(prom_url)
            batch = []
            while not collector.queue.empty():
                batch.append(collector.queue.get_nowait())
            collector.process(batch)
            time.sleep(1.0)
        collector.client.close()
    with db.connect() as conn:
        targets = {r.url: r for r in conn.execute(select(Target))}
        assert {u for u, t in targets.items() if t.configured_kind == "prometheus"} == {
            prom_url,
            *(f"http://engine-{i}:8000" for i in range(3)),
        }
        assert targets[prom_url].up and targets[prom_url].role == "source"  # not an engine on the pages
        assert {t.role for u, t in targets.items() if u != prom_url} == {"engine"}
        for i in range(3):
            tid = targets[f"http://engine-{i}:8000"].id
            assert targets[f"http://engine-{i}:8000"].name == f"engine-{i}:8000"

            def latest(signal: str, tid: int = tid) -> float:
                return (
                    conn.execute(
                        select(Sample.value)
                        .join(Series, Series.id == Sample.series_id)
                        .where(Series.target_id == tid, Series.signal == signal)
                        .order_by(Sample.ts.desc())
                    )
                    .scalars()
                    .first()
                )

            assert latest(sig.ENGINE_HIT_RATIO) == pytest.approx(0.5 + i / 20, abs=0.02)
            assert latest(sig.KV_USAGE) == pytest.approx(0.3 + i / 10)
            assert latest(sig.REQUESTS_RUNNING) == 4 + i
            assert latest(sig.PREFIX_CACHE_QUERIES_PER_S) == pytest.approx(1000 * (1 + i), rel=0.05)
    db.dispose()
