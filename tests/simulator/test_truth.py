"""simulator.truth: exact ground truth of why each missing prompt token was missing, on hand-made requests,
from both pools."""

from __future__ import annotations

import pytest

from simulator.config import EngineConfig
from simulator.content import SegmentContent
from simulator.engine import Engine, Request
from simulator.truth import Watch

SESSION = SegmentContent([("s1", 1 << 40)])


def serve(
    engine: Engine, content: SegmentContent, prompt: int, rid: str, group: str | None = None
) -> Request:
    req = Request(
        id=rid, content=content, prompt_tokens=prompt, max_tokens=5, arrival=engine.now, session=group
    )
    engine.add_request(req)
    while not engine.idle():
        engine.run_until(engine.now + 1.0)
    return req


def make(mode: str, blocks: int, classify=None) -> tuple[Engine, Watch]:
    engine = Engine(EngineConfig(pool_tokens=16 * blocks, block_size=16, mode=mode))
    watch = Watch(classify=classify, group=lambda req: req.session)
    engine.set_watch(watch)
    return engine, watch


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_cold_then_the_partial_block_and_new_tokens(mode: str) -> None:
    engine, watch = make(mode, 100)
    first = serve(engine, SESSION, 100, "r1", "s1")
    assert first.truth == ({"cold": 100}, {})
    # 100 + 5 - 1 = 104 tokens computed: 6 full blocks (96) kept, 8 tokens in a partial block
    assert watch.extent["s1"] == 104
    second = serve(engine, SESSION, 150, "r2", "s1")
    assert second.cached_tokens == 96
    assert second.truth == ({"partial-block": 8, "new": 46}, {})


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_an_eviction_is_classified_when_it_happens(mode: str) -> None:
    why = {"now": "parked"}
    engine, watch = make(mode, 20, classify=lambda label: why["now"] if label == "s1" else "other")
    serve(engine, SESSION, 100, "r1", "s1")
    # 19 blocks: the 13 never used, then s1's freed tail-first: its partial block and 5 of its 6 full ones
    serve(engine, SegmentContent([("other", 1 << 40)]), 300, "r2")
    why["now"] = "pressure"  # what holds later does not matter: the eviction was while parked
    again = serve(engine, SESSION, 150, "r3", "s1")
    assert again.cached_tokens == 16
    assert again.truth == ({"evicted-parked": 80, "partial-block": 8, "new": 46}, {"evicted-parked": 80})
    assert watch.evicted["parked"] == 5


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_a_rewritten_prefix_is_prefix_changed(mode: str) -> None:
    engine, watch = make(mode, 100)
    serve(engine, SegmentContent([(("doc", 0), 64), (("q", 1), 1 << 40)]), 100, "r1", "doc")
    watch.rewrite(("doc", 0), ("doc", 1))
    req = serve(engine, SegmentContent([(("doc", 1), 64), (("q", 2), 1 << 40)]), 100, "r2", "doc")
    assert req.cached_tokens == 0
    assert req.truth == ({"prefix-changed": 64, "new": 36}, {})


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_a_flush_drops_every_cached_key(mode: str) -> None:
    engine, watch = make(mode, 100)
    serve(engine, SESSION, 100, "r1", "s1")
    engine.flush()
    req = serve(engine, SESSION, 150, "r2", "s1")
    assert req.truth == ({"unattributed": 96, "partial-block": 8, "new": 46}, {"flushed": 96})
    assert watch.evicted["flush"] == 6


def test_without_a_watch_nothing_is_recorded() -> None:
    engine = Engine(EngineConfig(pool_tokens=1600, block_size=16))
    assert engine.pool.watch is None
    assert serve(engine, SESSION, 100, "r1", "s1").truth is None
