"""A real Prometheus scraping the simulator engine and the sidecar next to the collectors: for the same
window, PromQL's R_t, R_r and demand fraction (over the sidecar's counters and gauges) match what the
collectors stored within 0.02, the parked count exactly, and every exported recording rule has series."""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import pytest
from sqlalchemy import select

from collectors import prom_export
from collectors.prom_rules import ExportContext, recording_rules, rule_groups
from core import signals as sig
from core.alerts import AlertSettings
from db import make_engine
from db.models import Sample, Series, Target
from tests.collectors.promtools import prometheus_server
from tests.support import PYTHON, running, simulator_and_sidecar

WINDOW_S = 20
TOKEN = "operator-token-for-tests"


def _query(prom_url: str, promql: str, at: float) -> list[dict]:
    doc = httpx.get(
        f"{prom_url}/api/v1/query", params={"query": promql, "time": f"{at:.3f}"}, timeout=10
    ).json()
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def _one(prom_url: str, promql: str, at: float) -> float:
    result = _query(prom_url, promql, at)
    assert len(result) == 1, (promql, result)
    return float(result[0]["value"][1])


def _prometheus_config(engine_url: str, sidecar_url: str) -> str:
    def job(name: str, url: str) -> dict:
        return {"job_name": name, "static_configs": [{"targets": [url.removeprefix("http://")]}]}

    return json.dumps(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yml"],
            "scrape_configs": [job("vllm", engine_url), job("prefixops-sidecar", sidecar_url)],
        }
    )


def test_promql_over_the_sidecar_matches_what_the_collectors_stored(tmp_path):
    rules = prom_export.to_yaml(rule_groups(ExportContext(AlertSettings())))
    db_url = f"sqlite:///{tmp_path / 'prefixops.db'}"
    stop = threading.Event()
    with (
        simulator_and_sidecar(
            tmp_path,
            engine_args=("--pool-tokens", "40000"),
            sidecar_args=("--window-s", str(WINDOW_S)),
            sidecar_env={"PREFIXOPS_OPERATOR_TOKEN": TOKEN},
        ) as (engine_url, sidecar_url),
        prometheus_server(_prometheus_config(engine_url, sidecar_url), {"rules.yml": rules}) as prom_url,
        running(
            [
                PYTHON,
                "-m",
                "collectors",
                "--engine",
                engine_url,
                "--sidecar",
                sidecar_url,
                "--interval",
                "1",
                "--database-url",
                db_url,
            ],
            name="collectors",
        ),
    ):
        client = httpx.Client(base_url=sidecar_url, timeout=60)
        model = httpx.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["id"]
        shared = "You are a careful assistant who reads logs line by line. " * 60
        for idle in ("idle-1", "idle-2"):  # two sessions parked for the whole test: parked == 2 exactly
            assert (
                client.post(
                    "/v1/completions",
                    headers={"X-Session-Id": idle},
                    json={"model": model, "prompt": shared + idle, "max_tokens": 4},
                ).status_code
                == 200
            )
            r = client.post(
                f"/control/sessions/{idle}/park",
                headers={"Authorization": f"Bearer {TOKEN}"},
                json={"reason": "test"},
            )
            assert r.status_code == 200, r.text

        def traffic() -> None:
            rng = random.Random(7)
            i = 0
            while not stop.is_set():
                # Alternate a session that repeats its prompt (mostly cached) and one that never repeats (a miss):
                # R_t and R_r stay steady and apart, so one window is comparable with another.
                if i % 2 == 0:
                    sid, prompt = "warm", shared
                else:
                    sid, prompt = "cold", " ".join(str(rng.random()) for _ in range(400))
                client.post(
                    "/v1/completions",
                    headers={"X-Session-Id": sid},
                    json={"model": model, "prompt": prompt, "max_tokens": 4},
                )
                i += 1

        worker = threading.Thread(target=traffic, daemon=True)
        worker.start()
        try:
            time.sleep(WINDOW_S + 12)
            db = make_engine(db_url)
            with db.connect() as conn:
                tid = conn.execute(select(Target.id).where(Target.url == sidecar_url)).scalar_one()

                def stored(signal: str) -> tuple[float, float]:
                    row = conn.execute(
                        select(Sample.ts, Sample.value)
                        .join(Series, Series.id == Sample.series_id)
                        .where(Series.target_id == tid, Series.signal == signal)
                        .order_by(Sample.ts.desc())
                    ).first()
                    assert row is not None, f"no {signal} stored"
                    return float(row.ts), float(row.value)

                ts, r_t = stored(sig.TOKEN_WEIGHTED)
                _, r_r = stored(sig.REQUEST_WEIGHTED)
                _, demand = stored(sig.DEMAND_FRACTION)
                _, parked = stored(sig.PARKED)
            db.dispose()
            w = f"{WINDOW_S}s"
            promql_rt = _one(
                prom_url,
                f"sum(rate(prefixops_sidecar_known_cached_tokens_total[{w}])) / "
                f"sum(rate(prefixops_sidecar_known_prompt_tokens_total[{w}]))",
                ts,
            )
            promql_rr = _one(
                prom_url,
                f"sum(rate(prefixops_sidecar_hit_turns_total[{w}])) / "
                f"sum(rate(prefixops_sidecar_known_turns_total[{w}]))",
                ts,
            )
            promql_demand = _one(prom_url, "prefixops:sidecar_demand_fraction:ratio", ts)
            promql_parked = _one(prom_url, 'prefixops_sidecar_sessions{state="parked"}', ts)
        finally:
            stop.set()
            worker.join(timeout=70)
        print(
            f"stored R_t {r_t:.4f} R_r {r_r:.4f} demand {demand:.4f} parked {parked:g}; PromQL R_t {promql_rt:.4f} "
            f"R_r {promql_rr:.4f} demand {promql_demand:.4f} parked {promql_parked:g}"
        )
        assert 0.05 < r_t < 0.95 and r_r < 0.95, (r_t, r_r)  # a mix, not a trivial all-hit or all-miss
        assert promql_rt == pytest.approx(r_t, abs=0.02)
        assert promql_rr == pytest.approx(r_r, abs=0.02)
        assert demand > 0.05  # sessions hold a visible share of the pool
        assert promql_demand == pytest.approx(demand, abs=0.02)
        assert promql_parked == parked == 2
        now = time.time()
        missing = [
            r["record"]
            for r in recording_rules(ExportContext(AlertSettings()))
            if not _query(prom_url, r["record"], now)
        ]
        assert not missing, f"recording rules without series: {missing}"
