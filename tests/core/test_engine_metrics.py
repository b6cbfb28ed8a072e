"""core.engine_metrics against every fixture capture, with the expected values read from the files."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import signals as sig
from core.engine_metrics import (
    EngineSnapshot,
    MetricsPageError,
    filter_page,
    histogram_quantile,
    interval_signals,
    parse_engine_metrics,
    pool_tokens,
)
from tests.support import ENGINE_METRICS


def read(name: str) -> str:
    return (ENGINE_METRICS / name).read_text()


# Expected canonical values, written down from reading each file (SOURCES.md gives the totals).
EXPECTED = {
    "vllm-0.33.0-statlogger.prom": dict(
        kind="vllm",
        labels=["0"],
        process_start_ts=1.79593527806e09,
        pool=12160,
        values={
            "0": dict(
                prefix_cache_queries=25477.0,
                prefix_cache_hits=10576.0,
                prompt_tokens=25477.0,
                generation_tokens=1058.0,
                cached_tokens=10576.0,
                preemptions=1.0,
                kv_usage=0.6013157894736842,
                requests_running=7.0,
                requests_waiting=2.0,
                pool_tokens=12160,
            )
        },
        ttft_count={"0": 25.0},
    ),
    "sglang-0.5.23-collectors.prom": dict(
        kind="sglang",
        labels=[""],
        process_start_ts=None,
        pool=44856,
        # prompt 89395 + 79306 over is_streaming; cached (device) 55247; retractions 1.
        values={
            "": dict(
                prefix_cache_queries=168701.0,
                prefix_cache_hits=55247.0,
                prompt_tokens=168701.0,
                generation_tokens=14542.0 + 10232.0,
                cached_tokens=55247.0,
                preemptions=1.0,
                kv_usage=0.6,
                requests_running=7.0,
                requests_waiting=2.0,
                pool_tokens=44856,
            )
        },
        ttft_count={"": 51.0},
    ),
    "sglang-docs-llama-3.1-8b.prom": dict(
        kind="sglang",
        labels=[""],
        process_start_ts=None,
        pool=None,
        values={
            "": dict(
                prompt_tokens=8128902.0,
                generation_tokens=7557572.0,
                cached_tokens=None,
                prefix_cache_hits=None,
                kv_usage=0.28,
                requests_running=162.0,
                requests_waiting=2826.0,
                pool_tokens=None,
            )
        },
        ttft_count={"": 11008.0},
    ),
    "sglang-pr7944-deepseek-r1-fragment.prom": dict(
        kind="sglang",
        labels=[""],
        process_start_ts=None,
        pool=None,
        values={
            "": dict(
                cached_tokens=2688.0,
                prompt_tokens=None,
                kv_usage=0.0,
                requests_running=0.0,
                requests_waiting=None,
            )
        },
        ttft_count={},
    ),
    "sglang-dp8-deepseek-r1-fragment.prom": dict(
        kind="sglang", labels=[], process_start_ts=None, pool=None, values={}, ttft_count={}
    ),
    "vllm-0.10.0-glm-4.5-fragment.prom": dict(
        # current prefix_cache_queries_total (32); hits only under the legacy gpu_ name (0);
        # gpu_prefix_cache_queries appears only as a *_created sample, which is not data.
        kind="vllm",
        labels=["0"],
        process_start_ts=None,
        pool=None,
        values={
            "0": dict(
                prefix_cache_queries=32.0,
                prefix_cache_hits=0.0,
                kv_usage=9.75010481363281e-06,
                requests_running=None,
            )
        },
        ttft_count={},
    ),
    "vllm-v1-0.8era-qwen2.5-coder-32b-fragment.prom": dict(
        # legacy gpu_cache_usage_perc; no engine label; the last family's sample is cut off.
        kind="vllm",
        labels=[""],
        process_start_ts=1.74262400557e09,
        pool=None,
        values={
            "": dict(kv_usage=0.0, requests_running=0.0, requests_waiting=0.0, prefix_cache_queries=None)
        },
        ttft_count={},
    ),
}


def test_every_fixture_has_expectations():
    files = sorted(p.name for p in ENGINE_METRICS.glob("*.prom"))
    assert files == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_parses_to_expected_values(name):
    expected = EXPECTED[name]
    page = parse_engine_metrics(read(name))
    assert page.kind == expected["kind"]
    assert sorted(page.engines) == expected["labels"]
    assert page.process_start_ts == expected["process_start_ts"]
    for label, values in expected["values"].items():
        snapshot = page.engines[label]
        for field, value in values.items():
            assert getattr(snapshot, field) == value, (name, label, field)
    for label, count in expected["ttft_count"].items():
        buckets = page.engines[label].ttft_buckets
        assert buckets[-1][0] == math.inf and buckets[-1][1] == count
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:], strict=False))
    assert pool_tokens(read(name)) == expected["pool"]


def test_vllm_lifetime_hit_ratio_matches_sources_total():
    page = parse_engine_metrics(read("vllm-0.33.0-statlogger.prom"))
    assert page.engines["0"].hit_ratio_lifetime() == pytest.approx(10576 / 25477)
    sglang = parse_engine_metrics(read("sglang-0.5.23-collectors.prom"))
    assert sglang.engines[""].hit_ratio_lifetime() == pytest.approx(55247 / 168701)


def test_fragment_warnings_say_what_is_missing():
    docs = parse_engine_metrics(read("sglang-docs-llama-3.1-8b.prom"))
    assert any("cached_tokens_total" in w for w in docs.warnings)
    dp8 = parse_engine_metrics(read("sglang-dp8-deepseek-r1-fragment.prom"))
    assert any("no canonical sglang" in w for w in dp8.warnings)
    early = parse_engine_metrics(read("vllm-v1-0.8era-qwen2.5-coder-32b-fragment.prom"))
    assert early.prefix_cache_unit == "blocks"


def test_kind_can_be_forced_and_auto_detects():
    text = read("vllm-0.33.0-statlogger.prom")
    assert parse_engine_metrics(text, "vllm").kind == "vllm"
    assert parse_engine_metrics(text, "auto").kind == "vllm"


def test_filtering_keeps_every_value_of_the_full_page():
    from prometheus_client.parser import text_string_to_metric_families

    from core.engine_metrics.parse import _collect

    for name in EXPECTED:
        text = read(name)
        page = parse_engine_metrics(text)
        if page.kind == "unknown":
            continue
        full = _collect(list(text_string_to_metric_families(text)), page.kind)
        assert full.engines == page.engines, name
    # the kept lines: under 40% of the page (with the decode-time histogram the forecast's cost model needs)
    assert len(filter_page(read("vllm-0.33.0-statlogger.prom"))) < 0.4 * len(
        read("vllm-0.33.0-statlogger.prom")
    )


def _two_engine_page(
    q0: float,
    h0: float,
    q1: float,
    h1: float,
    *,
    start: float = 1000.0,
    cache_info: str = 'kv_cache_size_tokens="8000"',
) -> str:
    lines = [
        f"process_start_time_seconds {start}",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f'vllm:prefix_cache_queries_total{{engine="0"}} {q0}',
        f'vllm:prefix_cache_queries_total{{engine="1"}} {q1}',
        'vllm:prefix_cache_queries_created{engine="0"} 1.7e9',
        "# TYPE vllm:prefix_cache_hits_total counter",
        f'vllm:prefix_cache_hits_total{{engine="0"}} {h0}',
        f'vllm:prefix_cache_hits_total{{engine="1"}} {h1}',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{engine="0"} 0.2',
        'vllm:kv_cache_usage_perc{engine="1"} 0.6',
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0"} 3',
        'vllm:num_requests_running{engine="1"} 4',
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{engine="0",{cache_info}}} 1',
        f'vllm:cache_config_info{{engine="1",{cache_info}}} 1',
    ]
    return "\n".join(lines) + "\n"


def test_engine_labels_kept_apart_and_summed():
    page = parse_engine_metrics(_two_engine_page(100, 50, 300, 30))
    assert page.engines["0"].prefix_cache_queries == 100 and page.engines["1"].prefix_cache_queries == 300
    total = page.total()
    assert total.engine_label == ""
    assert total.prefix_cache_queries == 400 and total.prefix_cache_hits == 80
    assert total.requests_running == 7 and total.pool_tokens == 16000
    assert total.kv_usage == pytest.approx(0.4)


def test_pool_falls_back_to_blocks_times_block_size():
    text = _two_engine_page(
        1, 1, 1, 1, cache_info='kv_cache_size_tokens="None",num_gpu_blocks="760",block_size="16"'
    )
    assert pool_tokens(text) == 2 * 760 * 16


def test_created_samples_are_not_data():
    text = (
        '# TYPE vllm:prefix_cache_queries_created gauge\nvllm:prefix_cache_queries_created{engine="0"} 1.7e9\n'
        'vllm:num_requests_running{engine="0"} 1\n'
    )
    assert parse_engine_metrics(text).engines["0"].prefix_cache_queries is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty page"),
        ("   \n", "empty page"),
        ("<!DOCTYPE html><html><body>502 Bad Gateway</body></html>", "HTML page"),
        ('{"detail": "Not Found"}', "JSON instead"),
        ("hello world, nothing here\n", "no vLLM or SGLang metrics"),
        ('vllm:num_requests_running{engine="0" 7 7 oops\n', "malformed"),
        (
            'vllm:num_requests_running{engine="0",model_name="m"} 3\nvllm:kv_cache_usage_perc{engine="0",mod',
            "malformed",
        ),
    ],
)
def test_bad_pages_raise_with_a_reason(text, reason):
    with pytest.raises(MetricsPageError, match=reason):
        parse_engine_metrics(text)
    assert pool_tokens(text) is None


def test_nan_and_inf_are_missing_values():
    text = (
        'vllm:kv_cache_usage_perc{engine="0"} NaN\nvllm:num_requests_running{engine="0"} +Inf\n'
        'vllm:num_requests_waiting{engine="0"} 2\n'
    )
    page = parse_engine_metrics(text)
    snap = page.engines["0"]
    assert snap.kv_usage is None and snap.requests_running is None and snap.requests_waiting == 2
    assert any("NaN" in w for w in page.warnings)


def test_sglang_nan_gauge_in_real_capture_is_ignored():
    page = parse_engine_metrics(read("sglang-0.5.23-collectors.prom"))
    assert page.engines[""].kv_usage == 0.6  # fwd_occupancy is NaN on that page and not used


# ------------------------------------------------------------------ interval signals


def snap(q: float, h: float, **kw: float) -> EngineSnapshot:
    return EngineSnapshot(
        engine_label="0",
        prefix_cache_queries=q,
        prefix_cache_hits=h,
        prompt_tokens=q,
        cached_tokens=h,
        generation_tokens=kw.get("g", 0.0),
        preemptions=kw.get("p", 0.0),
        kv_usage=0.5,
        requests_running=2,
        requests_waiting=1,
        pool_tokens=1000,
    )


def test_interval_rates():
    result = interval_signals(snap(1000, 400, g=10), 10.0, snap(3000, 1900, g=30), 12.0)
    v = result.values
    assert v[sig.ENGINE_HIT_RATIO] == pytest.approx(1500 / 2000)
    assert v[sig.PROMPT_TOKENS_PER_S] == pytest.approx(1000)
    assert v[sig.CACHED_TOKENS_PER_S] == pytest.approx(750)
    assert v[sig.GENERATION_TOKENS_PER_S] == pytest.approx(10)
    assert v[sig.KV_USAGE] == 0.5 and v[sig.POOL_TOKENS] == 1000
    assert not result.reset


def test_counter_reset_gives_no_rate_not_a_negative_or_a_spike():
    result = interval_signals(snap(50_000, 40_000), 10.0, snap(900, 100), 11.0)
    assert result.reset
    assert sig.ENGINE_HIT_RATIO not in result.values and sig.PROMPT_TOKENS_PER_S not in result.values
    assert result.values[sig.KV_USAGE] == 0.5  # gauges still reported


def test_restart_flag_withholds_rates_even_when_counters_grew():
    result = interval_signals(snap(100, 50), 10.0, snap(5000, 100), 11.0, restarted=True)
    assert result.reset and sig.PROMPT_TOKENS_PER_S not in result.values


def test_gap_stays_a_gap():
    result = interval_signals(snap(100, 50), 10.0, snap(5000, 100), 100.0, max_gap_s=10.0)
    assert sig.PROMPT_TOKENS_PER_S not in result.values and not result.reset


def test_no_prompt_tokens_in_interval_means_no_hit_ratio():
    result = interval_signals(snap(100, 50), 10.0, snap(100, 50), 11.0)
    assert sig.ENGINE_HIT_RATIO not in result.values
    assert result.values[sig.PROMPT_TOKENS_PER_S] == 0.0


def test_ttft_quantiles_from_bucket_deltas():
    before = EngineSnapshot(ttft_buckets=((0.1, 10.0), (1.0, 10.0), (math.inf, 10.0)))
    after = EngineSnapshot(ttft_buckets=((0.1, 10.0), (1.0, 20.0), (math.inf, 20.0)))
    v = interval_signals(before, 0.0, after, 1.0).values
    # All 10 new observations fell in (0.1, 1.0]: p50 interpolates to the middle of that bucket.
    assert v[sig.TTFT_P50] == pytest.approx(0.55)
    assert v[sig.TTFT_P99] == pytest.approx(0.1 + 0.9 * 0.99)


def test_histogram_quantile_edges():
    assert histogram_quantile(0.5, ()) is None
    assert histogram_quantile(0.5, ((1.0, 0.0), (math.inf, 0.0))) is None
    assert histogram_quantile(0.99, ((1.0, 1.0), (math.inf, 10.0))) == 1.0


counters = st.floats(min_value=0, max_value=1e12, allow_nan=False)


@given(q0=counters, h0=counters, dq=counters, dh=counters, reset=st.booleans())
def test_hit_ratio_always_in_unit_interval_and_never_negative_rates(q0, h0, dq, dh, reset):
    prev = snap(q0, min(h0, q0))
    cur = snap(0.0 if reset else q0 + dq, 0.0 if reset else min(h0, q0) + min(dh, dq))
    values = interval_signals(prev, 0.0, cur, 1.0).values
    if sig.ENGINE_HIT_RATIO in values:
        assert 0.0 <= values[sig.ENGINE_HIT_RATIO] <= 1.0
    for name, value in values.items():
        assert value >= 0, name


def test_every_counter_of_a_snapshot_has_its_rate_signal():
    from core.engine_metrics.interval import RATE_SIGNAL
    from core.engine_metrics.snapshot import COUNTERS, EngineSnapshot

    assert tuple(RATE_SIGNAL) == COUNTERS
    assert all(hasattr(EngineSnapshot(), name) for name in COUNTERS)
