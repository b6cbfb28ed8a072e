"""core/engine_metrics/histograms.py: serving histogram quantiles over a scrape interval, exact values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from core import signals as sig
from core.engine_metrics import (
    EngineSnapshot,
    interval_signals,
    page_from_samples,
    parse_engine_metrics,
    sum_snapshots,
)
from core.engine_metrics.histograms import (
    MEAN_FAMILIES,
    bucket_delta,
    histogram_quantile,
    interval_means,
    interval_quantiles,
    merge,
)

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


def test_interval_mean_is_the_sums_increase_over_the_counts() -> None:
    before = {"e2e": ((10.0, 4.0), (20.0, 5.0), (math.inf, 5.0))}
    after = {"e2e": ((10.0, 4.0), (20.0, 5.0), (math.inf, 9.0))}  # 4 new requests, all above 20 s
    assert interval_means(before, {"e2e": 50.0}, after, {"e2e": 150.0}) == {"e2e_mean": 25.0}
    # the quantile knows only the bucket: above the largest finite bound, its bound
    assert interval_quantiles(before, after)["e2e_p50"] == 20.0
    assert interval_means(after, {"e2e": 150.0}, after, {"e2e": 150.0}) == {}  # nothing finished
    assert interval_means(before, {"e2e": 50.0}, after, {"e2e": 40.0}) == {}  # the sum went back: a reset
    assert interval_means(before, {}, after, {"e2e": 150.0}) == {}  # a sum missing on one side
    no_inf = {"e2e": ((10.0, 4.0),)}
    assert interval_means(no_inf, {"e2e": 1.0}, {"e2e": ((10.0, 6.0),)}, {"e2e": 9.0}) == {}  # no count


@pytest.mark.parametrize(
    ("capture", "label", "total", "count"),
    [
        ("vllm-0.33.0-statlogger.prom", "0", 38.45158100128174, 18.0),
        ("sglang-0.5.23-collectors.prom", "", 386.57268 + 257.0121, 51.0),  # streaming or not: summed
    ],
)
def test_pages_keep_the_e2e_sum_of_the_histogram_they_read(
    capture: str, label: str, total: float, count: float
) -> None:
    page = parse_engine_metrics((FIXTURES / capture).read_text())
    snap = page.engines[label]
    assert dict(snap.histogram_sums)["e2e"] == pytest.approx(total)
    assert dict(snap.histograms)["e2e"][-1] == (math.inf, count)


@pytest.mark.parametrize(
    ("capture", "label", "sums"),
    [
        (
            "vllm-0.33.0-statlogger.prom",
            "0",
            {"itl": 39.68624663352966, "decode_time": 31.851853132247925, "output_len": 852.0},
        ),
        ("sglang-0.5.23-collectors.prom", "", {"itl": 379.18046199993654, "output_len": 24774.0}),
    ],
)
def test_pages_keep_the_decode_sums_the_forecasts_cost_model_reads(
    capture: str, label: str, sums: dict[str, float]
) -> None:
    """``itl``, ``decode_time`` and ``output_len`` means: the exact mean decode step (SGLang has no decode time)."""
    kept = dict(parse_engine_metrics((FIXTURES / capture).read_text()).engines[label].histogram_sums)
    assert {f: kept[f] for f in ("itl", "decode_time", "output_len") if f in kept} == pytest.approx(sums)


def test_decode_means_over_an_interval() -> None:
    def snap(count: float, decode: float, tokens: float) -> EngineSnapshot:
        return EngineSnapshot(
            engine_label="0",
            histograms=(
                ("decode_time", ((0.3, 0.0), (0.5, count), (math.inf, count))),
                ("output_len", ((100.0, 0.0), (200.0, count), (math.inf, count))),
            ),
            histogram_sums=(("decode_time", decode), ("output_len", tokens)),
        )

    # 4 requests of 151 tokens decoded in 0.3 s each: a 2 ms step, where the medians say 0.4 s / 149 tokens
    values = interval_signals(snap(2.0, 0.6, 302.0), 0.0, snap(6.0, 1.8, 906.0), 1.0).values
    assert (values["decode_time_mean"], values["output_len_mean"]) == pytest.approx((0.3, 151.0))
    assert (values["decode_time_p50"], values["output_len_p50"]) == pytest.approx((0.4, 150.0))


def test_e2e_mean_over_a_scrape_interval_and_over_engine_labels() -> None:
    def snap(label: str, count: float, total: float | None) -> EngineSnapshot:
        return EngineSnapshot(
            engine_label=label,
            histograms=(("e2e", ((1.0, 0.0), (math.inf, count))),),
            histogram_sums=(("e2e", total),) if total is not None else (),
        )

    a = sum_snapshots([snap("0", 2.0, 4.0), snap("1", 1.0, 3.0)])
    b = sum_snapshots([snap("0", 4.0, 10.0), snap("1", 3.0, 13.0)])
    assert b.histogram_sums == (("e2e", 23.0),)
    assert interval_signals(a, 0.0, b, 1.0).values["e2e_mean"] == (23.0 - 7.0) / (7.0 - 3.0)
    # one label without the sum: a partial sum would give a wrong mean, so there is none
    partial = sum_snapshots([snap("0", 4.0, 10.0), snap("1", 3.0, None)])
    assert partial.histogram_sums == ()
    assert "e2e_mean" not in interval_signals(a, 0.0, partial, 1.0).values
    assert tuple(f"{f}_mean" for f in MEAN_FAMILIES) == sig.SERVING_MEANS
    assert set(sig.SERVING_MEANS) <= set(sig.ENGINE_SIGNALS)


def test_samples_from_a_query_api_carry_the_sum_too() -> None:
    labels = {"engine": "0"}
    rows = [
        ("vllm:e2e_request_latency_seconds_bucket", {**labels, "le": "10.0"}, 1.0),
        ("vllm:e2e_request_latency_seconds_bucket", {**labels, "le": "+Inf"}, 3.0),
        ("vllm:e2e_request_latency_seconds_sum", labels, 42.0),
    ]
    assert page_from_samples(rows).engines["0"].histogram_sums == (("e2e", 42.0),)
