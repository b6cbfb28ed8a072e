"""Property tests: the run-length pool behaves exactly like the per-block reference, and neither loses a block."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.content import SegmentContent
from simulator.pool import BlockPool, RunPool

BS = 4
NUM_BLOCKS = 24

# contents share prefixes through path labels: a common head, two "system prompts", per-request tails
CONTENTS = (
    [SegmentContent([("head", 6), ("sysA", 10), (("tail", i), 1 << 20)]) for i in range(3)]
    + [SegmentContent([("head", 6), ("sysB", 7), (("tail", i), 1 << 20)]) for i in range(3, 5)]
    + [SegmentContent([("head", 6), (("short", i), 9)]) for i in range(7, 9)]
    + [SegmentContent([(("solo", i), 1 << 20)]) for i in range(5, 7)]
)

op = st.one_of(
    st.tuples(st.just("start"), st.integers(0, len(CONTENTS) - 1), st.integers(1, 60)),
    st.tuples(st.just("grow"), st.integers(0, 7), st.integers(1, 12)),
    st.tuples(st.just("free"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("reset"), st.just(0), st.just(0)),
)


class Driver:
    """Drives one pool the way the engine does: lookup + allocate at admission, grow, free."""

    def __init__(self, pool: BlockPool | RunPool) -> None:
        self.pool = pool
        self.active: list[tuple[object, int, int]] = []  # (table, content index, tokens)

    def start(self, ci: int, tokens: int) -> tuple[int, int, bool]:
        content = CONTENTS[ci]
        hit = self.pool.lookup(content, (tokens - 1) // BS)
        table = self.pool.new_table()
        ok = self.pool.allocate(table, content, hit, -(-tokens // BS), tokens // BS)
        if ok:
            self.active.append((table, ci, tokens))
        return hit.hit_blocks, hit.hit_free_blocks, ok

    def grow(self, k: int, extra: int) -> bool | None:
        if not self.active:
            return None
        table, ci, tokens = self.active[k % len(self.active)]
        new = tokens + extra
        ok = self.pool.allocate(table, CONTENTS[ci], None, -(-new // BS), new // BS)
        if ok:
            self.active[k % len(self.active)] = (table, ci, new)
        return ok

    def free(self, k: int) -> None:
        if self.active:
            table, _, _ = self.active.pop(k % len(self.active))
            self.pool.free(table)

    def reset(self) -> bool:
        for table, _, _ in self.active:
            self.pool.free(table)
        self.active = []
        return self.pool.reset()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=60))
def test_run_pool_matches_block_pool_and_loses_no_block(ops: list[tuple[str, int, int]]) -> None:
    exact = Driver(BlockPool(NUM_BLOCKS, BS))
    fast = Driver(RunPool(NUM_BLOCKS, BS))
    for name, a, b in ops:
        if name == "start":
            assert exact.start(a, b) == fast.start(a, b)
        elif name == "grow":
            assert exact.grow(a, b) == fast.grow(a, b)
        elif name == "free":
            exact.free(a)
            fast.free(a)
        else:
            assert exact.reset() == fast.reset()
        exact.pool.check()
        fast.pool.check()
        in_use = sum(t.num_blocks for t, _, _ in exact.active)
        # shared blocks are counted once per holder in tables, so in-use blocks <= table total
        assert exact.pool.num_blocks - exact.pool.num_free() <= in_use
        assert exact.pool.num_free() == fast.pool.num_free()
        assert exact.pool.num_cached_free() == fast.pool.num_cached_free()
        assert exact.pool.num_cached() == fast.pool.num_cached()
        assert exact.pool.evictions() == fast.pool.evictions()
        assert exact.pool.queue_keys() == fast.pool.queue_keys()
        for content in CONTENTS:
            assert exact.pool.lookup(content, 40).hit_blocks == fast.pool.lookup(content, 40).hit_blocks
    for table, _, _ in exact.active:
        exact.pool.free(table)
    for table, _, _ in fast.active:
        fast.pool.free(table)
    assert exact.pool.num_free() == fast.pool.num_free() == NUM_BLOCKS
