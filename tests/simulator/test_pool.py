"""Mechanism tests of the block pool, run against both implementations (exact reference and run-length)."""

from __future__ import annotations

import pytest

from simulator.content import SegmentContent
from simulator.pool import BlockPool, RunPool

POOLS = [BlockPool, RunPool]


def session(name: str) -> SegmentContent:
    return SegmentContent([(("s", name), 1 << 30)])


def run_request(pool: BlockPool | RunPool, content: SegmentContent, blocks: int) -> None:
    """Allocate ``blocks`` full blocks for a new request (with its prefix hit) and free it."""
    hit = pool.lookup(content, blocks)
    table = pool.new_table()
    assert pool.allocate(table, content, hit, blocks, blocks)
    pool.free(table)


@pytest.mark.parametrize("cls", POOLS)
def test_free_queue_is_lru_and_freeing_is_tail_first(cls: type) -> None:
    pool = cls(8, 4)
    run_request(pool, session("a"), 3)
    run_request(pool, session("b"), 3)
    # never-used blocks first, then a's blocks tail first, then b's
    assert pool.queue_keys() == [
        None,
        None,
        (("s", "a"), 2),
        (("s", "a"), 1),
        (("s", "a"), 0),
        (("s", "b"), 2),
        (("s", "b"), 1),
        (("s", "b"), 0),
    ]
    # a 3-block request of c evicts the two unused blocks, then a's tail block
    run_request(pool, session("c"), 3)
    assert pool.evictions() == 1
    assert pool.lookup(session("a"), 10).hit_blocks == 2  # a's prefix eroded from its end: still usable
    assert pool.lookup(session("b"), 10).hit_blocks == 3
    pool.check()


@pytest.mark.parametrize("cls", POOLS)
def test_hit_takes_blocks_out_of_the_queue_and_refreshes_them(cls: type) -> None:
    pool = cls(6, 4)
    run_request(pool, session("a"), 3)
    run_request(pool, session("b"), 3)
    # a is reused: its blocks move to the tail, so b is now the least recently used
    run_request(pool, session("a"), 3)
    run_request(pool, session("c"), 3)
    assert pool.lookup(session("a"), 10).hit_blocks == 3
    assert pool.lookup(session("b"), 10).hit_blocks == 0
    pool.check()


@pytest.mark.parametrize("cls", POOLS)
def test_shared_prefix_blocks_stay_in_use_while_any_holder_runs(cls: type) -> None:
    pool = cls(10, 4)
    shared = [("sys", 8)]
    a = SegmentContent([*shared, (("s", "a"), 1 << 30)])
    b = SegmentContent([*shared, (("s", "b"), 1 << 30)])
    ta = pool.new_table()
    assert pool.allocate(ta, a, pool.lookup(a, 3), 3, 3)
    hit = pool.lookup(b, 3)
    assert hit.hit_blocks == 2 and hit.hit_free_blocks == 0  # the system prompt's two blocks, in use
    tb = pool.new_table()
    assert pool.allocate(tb, b, hit, 3, 3)
    assert pool.num_free() == 10 - 4
    pool.free(ta)
    assert pool.num_free() == 10 - 3  # a's own block freed; the shared ones still held by b
    pool.free(tb)
    assert pool.num_free() == 10
    pool.check()


@pytest.mark.parametrize("cls", POOLS)
def test_allocation_failure_changes_nothing(cls: type) -> None:
    pool = cls(4, 4)
    t = pool.new_table()
    assert pool.allocate(t, session("a"), None, 3, 3)
    before = (pool.num_free(), pool.queue_keys())
    assert not pool.allocate(pool.new_table(), session("b"), None, 2, 2)
    assert (pool.num_free(), pool.queue_keys()) == before
    pool.check()


@pytest.mark.parametrize("cls", POOLS)
def test_reset_drops_every_key_but_needs_all_blocks_free(cls: type) -> None:
    pool = cls(8, 4)
    t = pool.new_table()
    assert pool.allocate(t, session("a"), None, 3, 3)
    assert not pool.reset()
    pool.free(t)
    assert pool.num_cached_free() == 3
    assert pool.reset()
    assert pool.num_cached() == 0 and pool.num_cached_free() == 0
    assert pool.lookup(session("a"), 10).hit_blocks == 0
    pool.check()


@pytest.mark.parametrize("cls", POOLS)
def test_only_full_blocks_are_keyed(cls: type) -> None:
    pool = cls(8, 4)
    t = pool.new_table()
    # 10 tokens: blocks 0 and 1 full and cacheable, block 2 partial
    assert pool.allocate(t, session("a"), None, 3, 10 // 4)
    pool.free(t)
    assert pool.num_cached() == 2
    assert pool.lookup(session("a"), 10).hit_blocks == 2
