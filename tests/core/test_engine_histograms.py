"""core/engine_metrics/histograms.py: serving histogram quantiles over a scrape interval, exact values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from core.engine_metrics import EngineSnapshot, interval_signals, parse_engine_metrics, sum_snapshots
from core.engine_metrics.histograms import bucket_delta, histogram_quantile, interval_quantiles, merge

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engine-metrics"


def test_interval_quantiles_from_the_buckets_increase() -> None:
    before = {"e2e": ((1.0, 5.0), (2.0, 5.0), (math.inf, 5.0))}
    after = {"e2e": ((1.0, 5.0), (2.0, 15.0), (math.inf, 15.0))}  # 10 new requests, all in (1, 2]
    assert interval_quantiles(before, after) == {
        "e2e_p50": 1.5,
        "e2e_p90": 1.9,
        "e2e_p99": pytest.approx(1.99),
    }
    assert interval_quantiles(after, after) == {}  # nothing observed: absent, not 0
    assert interval_quantiles(after, before) == {}  # a reset


def test_bucket_delta_and_merge() -> None:
    assert bucket_delta(((1.0, 1.0),), ((2.0, 1.0),)) is None  # changed bounds
    assert merge([((1.0, 1.0), (math.inf, 2.0)), ((1.0, 3.0), (math.inf, 3.0))]) == (
        (1.0, 4.0),
        (math.inf, 5.0),
    )
    assert histogram_quantile(0.5, ((10.0, 0.0), (math.inf, 4.0))) == 10.0


@pytest.mark.parametrize(
    ("capture", "families"),
    [
        (
            "vllm-0.33.0-statlogger.prom",
            ["e2e", "itl", "queue_time", "prompt_len", "output_len", "decode_time"],
        ),
        ("sglang-0.5.23-collectors.prom", ["e2e", "itl", "queue_time", "prompt_len", "output_len"]),
    ],
)
def test_captures_carry_the_serving_histograms(capture: str, families: list[str]) -> None:
    page = parse_engine_metrics((FIXTURES / capture).read_text())
    found = {f for e in page.engines.values() for f, buckets in e.histograms if buckets}
    assert set(families) <= found


def test_interval_signals_and_sum_over_ranks_carry_every_family() -> None:
    a0 = EngineSnapshot(engine_label="0", histograms=(("queue_time", ((0.5, 0.0), (math.inf, 0.0))),))
    a1 = EngineSnapshot(engine_label="1", histograms=(("queue_time", ((0.5, 0.0), (math.inf, 0.0))),))
    b0 = EngineSnapshot(engine_label="0", histograms=(("queue_time", ((0.5, 4.0), (math.inf, 4.0))),))
    b1 = EngineSnapshot(engine_label="1", histograms=(("queue_time", ((0.5, 0.0), (math.inf, 4.0))),))
    total_a, total_b = sum_snapshots([a0, a1]), sum_snapshots([b0, b1])
    assert total_b.histograms == (("queue_time", ((0.5, 4.0), (math.inf, 8.0))),)
    values = interval_signals(total_a, 0.0, total_b, 1.0).values
    assert values["queue_time_p50"] == 0.5 and values["queue_time_p90"] == 0.5  # above 0.5: its bound
