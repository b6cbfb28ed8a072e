"""The sidecar's /metrics for PromQL (issue 14 item 2): the names the Prometheus rules use, their values,
and docs/sidecar-metrics.md generated from the collector's own definitions."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.metrics import METRICS, metrics_table
from tests.support import REPO

from .conftest import OP_HEADERS, sidecar

pytestmark = pytest.mark.anyio

REQUIRED = {
    "prefixops_sidecar_known_prompt_tokens_total": "counter",
    "prefixops_sidecar_known_cached_tokens_total": "counter",
    "prefixops_sidecar_known_turns_total": "counter",
    "prefixops_sidecar_hit_turns_total": "counter",
    "prefixops_sidecar_parks_total": "counter",
    "prefixops_sidecar_unparks_total": "counter",
    "prefixops_sidecar_compaction_deferrals_total": "counter",
    "prefixops_sidecar_engine_errors_total": "counter",
    "prefixops_sidecar_oldest_waiting_seconds": "gauge",
    "prefixops_sidecar_oldest_parked_seconds": "gauge",
    "prefixops_sidecar_demand_tokens": "gauge",
    "prefixops_sidecar_pool_tokens": "gauge",
    "prefixops_sidecar_band_low": "gauge",
    "prefixops_sidecar_band_high": "gauge",
    "prefixops_sidecar_sessions": "gauge",
    "prefixops_sidecar_admission_wait_seconds": "histogram",
    "prefixops_sidecar_park_duration_seconds": "histogram",
}


def samples(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def test_required_names_are_declared_with_their_types() -> None:
    declared = {m.exposed: m.kind for m in METRICS}
    for name, kind in REQUIRED.items():
        assert declared.get(name) == kind, name


def test_metrics_doc_is_generated_from_the_definitions() -> None:
    assert Path(REPO, "docs", "sidecar-metrics.md").read_text() == metrics_table(), (
        "docs/sidecar-metrics.md drifted: run python -m sidecar.metrics > docs/sidecar-metrics.md"
    )


async def test_rt_rr_counters_parks_and_histograms(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=1_000_000) as h:
        first = (await h.chat("s1", system="shared instructions " * 20)).json()["usage"]
        second = (await h.chat("s1", system="shared instructions " * 20)).json()["usage"]
        text = (await h.client.get("/metrics")).text
        families = {f.name: f.type for f in text_string_to_metric_families(text)}
        for name, kind in REQUIRED.items():
            base = name.removesuffix("_total")
            assert families.get(base) == kind, name
        v = samples(text)
        cached = second["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0 and first["prompt_tokens_details"]["cached_tokens"] == 0
        assert v["prefixops_sidecar_known_turns_total"] == 2
        assert v["prefixops_sidecar_hit_turns_total"] == 1
        assert (
            v["prefixops_sidecar_known_prompt_tokens_total"]
            == first["prompt_tokens"] + second["prompt_tokens"]
        )
        assert v["prefixops_sidecar_known_cached_tokens_total"] == cached
        assert v["prefixops_sidecar_oldest_parked_seconds"] == 0 and v["prefixops_sidecar_parks_total"] == 0
        # an operator park, 30 s parked, then its next turn is held until the unpark
        await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS)
        h.clock.advance(30)
        v = samples((await h.client.get("/metrics")).text)
        assert v["prefixops_sidecar_parks_total"] == 1 and v["prefixops_sidecar_oldest_parked_seconds"] == 30
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.chat, "s1")
            for _ in range(200):
                if h.cp.held_requests:
                    break
                await anyio.sleep(0.005)
            h.clock.advance(4)
            await h.client.post("/control/sessions/s1/unpark", headers=OP_HEADERS)
        v = samples((await h.client.get("/metrics")).text)
        assert v["prefixops_sidecar_unparks_total"] == 1 and v["prefixops_sidecar_oldest_parked_seconds"] == 0
        assert v["prefixops_sidecar_park_duration_seconds_count"] == 1
        assert v["prefixops_sidecar_park_duration_seconds_sum"] == 34
        assert v["prefixops_sidecar_park_duration_seconds_bucket{le=30.0}"] == 0
        assert v["prefixops_sidecar_park_duration_seconds_bucket{le=60.0}"] == 1
        assert v["prefixops_sidecar_admission_wait_seconds_count"] == 1
        assert v["prefixops_sidecar_admission_wait_seconds_sum"] == 4
        await h.client.post("/compaction/requests", json={"subtrees": ["x"], "urgency": "normal"})
        state = await h.state()
        assert (
            state["backlog"]["park_time_s"]["max"] == 34 and state["backlog"]["time_to_admit_s"]["p50"] == 4
        )
