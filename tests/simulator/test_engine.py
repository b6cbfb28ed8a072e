"""Mechanism tests of the engine: the vLLM V1 scheduler rules, the cost model and the metric semantics."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from simulator.config import CostModel, EngineConfig
from simulator.content import SegmentContent
from simulator.engine import FINISHED, RUNNING, WAITING, Engine, Request
from simulator.metrics import engine_registry

MODES = ["fast", "exact"]


def content(name: str, shared: int = 0) -> SegmentContent:
    segs = [("sys", shared)] if shared else []
    return SegmentContent([*segs, (("s", name), 1 << 30)])


def request(
    name: str, prompt: int, out: int, at: float = 0.0, shared: int = 0, c: SegmentContent | None = None
) -> Request:
    return Request(
        id=name, content=c or content(name, shared), prompt_tokens=prompt, max_tokens=out, arrival=at
    )


def drain(engine: Engine, limit: float = 1e6) -> list[Request]:
    done: list[Request] = []
    while not engine.idle() and engine.now < limit:
        done += engine.run_until(limit)
    return done


@pytest.mark.parametrize("mode", MODES)
def test_hit_is_capped_at_prompt_minus_one_and_block_granular(mode: str) -> None:
    engine = Engine(EngineConfig(pool_tokens=16 * 64, mode=mode))
    c = content("a")
    engine.add_request(request("first", 64, 1, c=c))
    drain(engine)
    engine.add_request(request("again", 64, 1, at=engine.now, c=c))
    (again,) = drain(engine)
    assert again.cached_tokens == 48  # 4 cached blocks, but the last token is always recomputed
    engine.add_request(request("longer", 70, 1, at=engine.now, c=c))
    (longer,) = drain(engine)
    assert longer.cached_tokens == 64 and longer.cached_tokens % 16 == 0


@pytest.mark.parametrize("mode", MODES)
def test_preemption_takes_the_newest_and_resets_its_progress(mode: str) -> None:
    engine = Engine(EngineConfig(pool_tokens=16 * 8, mode=mode))
    a = request("a", 40, 60)
    b = request("b", 40, 60)
    engine.add_request(a)
    engine.add_request(b)
    while engine.stats.preemptions == 0:
        engine.run_until(engine.now + 0.001)
    assert b.status == WAITING and b.num_computed == 0 and b.preemptions == 1
    assert engine.waiting[0] is b
    assert a.status == RUNNING and a.num_computed > 40
    queries_before, hits_before = engine.stats.prefix_queries, engine.stats.prefix_hits
    drain(engine)
    assert a.status == FINISHED and b.status == FINISHED
    # b's re-admission looked up its own freed blocks: recomputed tokens count as hits
    assert engine.stats.prefix_queries > queries_before
    assert engine.stats.prefix_hits > hits_before
    assert b.cached_tokens == 0  # the client sees the first admission's cached tokens


@pytest.mark.parametrize("mode", MODES)
def test_a_step_that_preempted_admits_nobody_and_the_waiting_head_blocks_admission(mode: str) -> None:
    engine = Engine(EngineConfig(pool_tokens=16 * 8, mode=mode))
    a = request("a", 48, 60)
    b = request("b", 48, 60)
    engine.add_request(a)
    engine.add_request(b)
    engine.run_until(engine.now + 1e-9)  # one step: both admitted, 3 blocks each
    c = request("c", 10, 1, at=engine.now)
    engine.add_request(c)
    while engine.stats.preemptions == 0:
        engine.run_until(engine.now + 1e-9)
    # the step that preempted b freed 4 blocks, enough for c, yet admitted nobody
    assert list(engine.waiting) == [b, c]
    engine.run_until(engine.now + 1e-9)
    # b, at the head, does not fit; c, which would, waits behind it (waiting requests never preempt)
    assert list(engine.waiting) == [b, c] and a.preemptions == 0
    drain(engine)
    assert {a.status, b.status, c.status} == {FINISHED}


@pytest.mark.parametrize("mode", MODES)
def test_usage_gauge_counts_only_blocks_of_running_requests(mode: str) -> None:
    engine = Engine(EngineConfig(pool_tokens=16 * 100, mode=mode))
    engine.add_request(request("a", 320, 2))
    engine.run_until(engine.now + 1e-9)
    assert engine.kv_usage > 0
    drain(engine)
    assert engine.kv_usage == 0.0
    assert engine.pool.num_cached_free() == 20  # the idle session's prefix is there, invisible to the gauge
    text = generate_latest(engine_registry(engine, 0.0)).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["vllm:kv_cache_usage_perc"] == 0.0
    assert samples["sim:cached_free_blocks"] == 20


def test_latency_histograms_are_exported_in_wall_seconds_at_the_servers_speed() -> None:
    """The collectors record wall-clock time: at speed x10 a 2.5 simulated-second bucket is 0.25 s."""
    engine = Engine(EngineConfig(pool_tokens=16 * 100))
    engine.add_request(request("a", 320, 20))
    drain(engine)

    def samples(scale: float) -> dict[tuple[str, str], float]:
        text = generate_latest(engine_registry(engine, 0.0, time_scale=scale)).decode()
        return {
            (s.name, s.labels.get("le", "")): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }

    sim, wall = samples(1.0), samples(10.0)
    e2e = engine.stats.e2e.total
    assert sim[("vllm:e2e_request_latency_seconds_sum", "")] == pytest.approx(e2e, rel=1e-12)
    assert wall[("vllm:e2e_request_latency_seconds_sum", "")] == pytest.approx(e2e / 10, rel=1e-12)
    assert (
        wall[("vllm:request_decode_time_seconds_bucket", "0.25")]
        == sim[("vllm:request_decode_time_seconds_bucket", "2.5")]
    )
    # token histograms keep their units
    assert (
        wall[("vllm:request_prompt_tokens_bucket", "500.0")]
        == sim[("vllm:request_prompt_tokens_bucket", "500.0")]
    )
    with pytest.raises(ValueError, match="time_scale must be > 0, got 0"):
        engine_registry(engine, 0.0, time_scale=0)


@pytest.mark.parametrize("mode", MODES)
def test_flush_preempts_running_requests_and_clears_the_cache(mode: str) -> None:
    engine = Engine(EngineConfig(pool_tokens=16 * 100, mode=mode))
    c = content("a")
    engine.add_request(request("warm", 320, 1, c=c))
    drain(engine)
    engine.add_request(request("running", 640, 50, at=engine.now, c=content("b")))
    engine.run_until(engine.now + 0.2)
    assert engine.running
    assert engine.flush() == 1
    assert engine.stats.preemptions == 1 and engine.pool.num_cached() == 0
    drain(engine)
    engine.add_request(request("after", 330, 1, at=engine.now, c=c))
    (after,) = drain(engine)
    assert after.cached_tokens == 0


def test_cost_model_reproduces_the_published_prefill_figures() -> None:
    cost = CostModel()
    miss = cost.prefill_time(0, 21_600)
    hit = cost.prefill_time(20_600, 1_000)
    assert miss == pytest.approx(2.0, rel=0.02)
    assert hit == pytest.approx(0.15, rel=0.02)
    # attention-aware: chunking does not change the cost
    chunked = sum(cost.prefill_time(s, min(8192, 21_600 - s)) for s in range(0, 21_600, 8192))
    assert chunked == pytest.approx(miss, rel=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_chunked_prefill_time_to_first_token_of_a_miss(mode: str) -> None:
    engine = Engine(EngineConfig(mode=mode))
    engine.add_request(request("miss", 21_600, 1))
    (done,) = drain(engine)
    steps = -(-21_600 // 8192)
    assert engine.stats.steps == steps
    expected = CostModel().prefill_time(0, 21_600) + steps * CostModel().step_overhead_s
    assert done.first_token_time == pytest.approx(expected, rel=1e-9)


def test_max_num_seqs_limits_the_running_batch() -> None:
    engine = Engine(EngineConfig(max_num_seqs=2, mode="exact"))
    for i in range(4):
        engine.add_request(request(f"r{i}", 100, 5))
    engine.run_until(1e-9)
    assert len(engine.running) == 2 and len(engine.waiting) == 2


@pytest.mark.parametrize("guard", [False, True])
def test_full_sequence_fit_guard_holds_back_what_could_not_finish(guard: bool) -> None:
    engine = Engine(EngineConfig(pool_tokens=16 * 10, full_sequence_fit=guard, mode="exact"))
    engine.add_request(request("a", 48, 40))
    engine.run_until(1e-9)
    big = request("big", 64, 60, at=engine.now)  # prompt fits the 7 free blocks, prompt + output (8) does not
    engine.add_request(big)
    engine.run_until(engine.now + 1e-9)
    assert (big.status == WAITING) is guard


@pytest.mark.parametrize("mode", MODES)
def test_cpu_offload_tier_serves_evicted_prefixes_as_external_hits(mode: str) -> None:
    engine = Engine(EngineConfig(pool_tokens=16 * 40, offload_tokens=16 * 100, mode=mode))
    a = content("a")
    engine.add_request(request("a1", 320, 1, c=a))  # 20 blocks
    drain(engine)
    engine.add_request(request("b", 600, 1, at=engine.now))  # evicts a's blocks into the CPU tier
    drain(engine)
    assert engine.pool.evictions() > 0 and engine.pool.offload_count() > 0
    engine.add_request(request("a2", 340, 1, at=engine.now, c=a))
    (a2,) = drain(engine)
    assert engine.stats.external_hits > 0
    assert a2.cached_tokens >= engine.stats.external_hits > 0
