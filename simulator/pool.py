"""The KV block pool, as vLLM V1's BlockPool + KVCacheManager manage it.

Semantics (both implementations, identical by construction and by test):

* ``num_blocks`` blocks. A block is *in use* (``ref_cnt > 0``, held by running
  requests) or *free*. Free blocks sit in one queue in eviction order; a free
  block may still carry a key (a *cached-free* block, reusable by a later hit).
* Allocation takes blocks from the head of the free queue and drops their keys
  (eviction). A request's blocks are freed tail-first (its last block enters
  the queue first), so an idle prefix erodes from its end and what survives is
  still a usable prefix. Blocks still used by another request are not freed.
* Only full blocks get a key; a block is keyed when its tokens are scheduled
  for computation. If the key is already cached elsewhere the new block stays
  unkeyed (vLLM keeps such duplicates too; we drop them, which only matters
  for identical prefills running at the same time).
* A hit on a free cached block takes it out of the queue (``touch``).
* ``reset()`` (prefix-cache flush) drops every key; it needs no block in use.

``BlockPool`` is the exact per-block reference. ``RunPool`` keeps the same
state run-length encoded (contiguous runs of one path label, one ref count,
adjacent in the queue) so an agent turn costs a handful of operations instead
of a few per block; it is the default.

Optional CPU offload tier (``offload_blocks > 0``): a block evicted with a key
goes to a second LRU; a lookup continues into it after the device prefix ends
and such blocks are loaded (counted separately; the engine charges a per-token
load cost) instead of recomputed.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from simulator.content import Content


@dataclass
class Lookup:
    """Result of a prefix lookup: device-hit blocks, of which free (evictable), and offload-tier blocks."""

    hit_blocks: int = 0
    hit_free_blocks: int = 0
    offload_blocks: int = 0
    blocks: list[int] | None = None  # BlockPool: the hit block ids, for the allocation that follows
    block_array: Any = (
        None  # BlockPool: the same ids as a numpy array (read-only, shared with the lookup cache)
    )


class Table(Protocol):
    num_blocks: int


class Pool(Protocol):
    num_blocks: int
    block_size: int
    watch: Any  # a simulator.truth.Watch, or None (the default: nothing recorded)

    def num_free(self) -> int: ...
    def num_cached_free(self) -> int: ...
    def num_cached(self) -> int: ...
    def new_table(self) -> Table: ...
    def lookup(self, content: Content, max_blocks: int) -> Lookup: ...
    def allocate(
        self, table: Table, content: Content, hit: Lookup | None, total_blocks: int, cacheable_blocks: int
    ) -> bool: ...
    def cache_upto(self, table: Table, content: Content, cacheable_blocks: int) -> None: ...
    def free(self, table: Table) -> None: ...
    def reset(self) -> bool: ...
    def evictions(self) -> int: ...
    def offload_count(self) -> int: ...


class _OffloadTier:
    """LRU of keys evicted from the device (the CPU tier), ``capacity`` blocks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.keys: OrderedDict[Hashable, None] = OrderedDict()

    def put(self, key: Hashable) -> None:
        if self.capacity <= 0:
            return
        self.keys[key] = None
        self.keys.move_to_end(key)
        while len(self.keys) > self.capacity:
            self.keys.popitem(last=False)

    def contains_run(self, content: Content, first: int, end: int, block_size: int) -> int:
        if self.capacity <= 0 or first >= end:
            return 0
        n = 0
        for label, lo, hi in content.spans(first, end, block_size):
            for i in range(lo, hi):
                key = (label, i)
                if key not in self.keys:
                    return n
                self.keys.move_to_end(key)
                n += 1
        return n


# --------------------------------------------------------------------------- exact
@dataclass(eq=False)
class BlockTable:
    blocks: list[int]
    keyed: int = 0  # chain positions [0, keyed) have been considered for keying
    num_blocks: int = 0  # len(blocks), kept as a field: the scheduler reads it every step


class BlockPool:
    """Exact per-block pool (the reference).

    Every block is its own entry: a ref count, a key (``key_to_block`` maps each
    cached key to its block) and a place in the free queue. For speed the
    per-block state lives in numpy arrays and batch operations over a request's
    blocks run as vectorised calls, but nothing is aggregated:

    * keys are integers ``label_base + block_index`` (one base per path label);
    * the free queue is an append-only list of entries ``stamp * num_blocks + block``
      read from a head index; a block's entry is valid while the block is free
      and its stamp matches (touching or re-freeing a block invalidates its old
      entry), so removal from the middle is O(1) and the order is exactly the
      order blocks were freed.
    """

    def __init__(self, num_blocks: int, block_size: int, offload_blocks: int = 0) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = np.zeros(num_blocks, dtype=np.int64)
        self.keyed = np.zeros(num_blocks, dtype=bool)
        self.stamp = np.zeros(num_blocks, dtype=np.int64)
        self.key = np.full(num_blocks, -1, dtype=np.int64)
        self.key_to_block: dict[int, int] = {}
        self.labels: dict[Hashable, int] = {}
        self.label_of: list[Hashable] = []
        self._q: list[int] = list(range(num_blocks))  # stamp 0
        self._head = 0
        self._stale = 0  # entries in the queue whose block was taken out by a hit
        self._ver: dict[int, int] = {}  # label base -> changes of its keys (for the lookup cache)
        self._lookups: dict[tuple[int, int], tuple[Content, tuple[int, ...], list[int]]] = {}
        self._next_stamp = 1
        self._free = num_blocks
        self.offload = _OffloadTier(offload_blocks)
        self._evictions = 0
        self._cached_free = 0
        self.watch: Any = None

    def _base(self, label: Hashable) -> int:
        base = self.labels.get(label)
        if base is None:
            base = len(self.label_of) << 32
            self.labels[label] = base
            self.label_of.append(label)
        return base

    def external_key(self, k: int) -> Hashable:
        return (self.label_of[k >> 32], k & 0xFFFFFFFF)

    def num_free(self) -> int:
        return self._free

    def num_cached_free(self) -> int:
        return self._cached_free

    def num_cached(self) -> int:
        return len(self.key_to_block)

    def evictions(self) -> int:
        return self._evictions

    def offload_count(self) -> int:
        return len(self.offload.keys)

    def new_table(self) -> BlockTable:
        return BlockTable([])

    def lookup(self, content: Content, max_blocks: int) -> Lookup:
        result = Lookup()
        spans = [
            (self._base(label), lo, hi) for label, lo, hi in content.spans(0, max_blocks, self.block_size)
        ]
        versions = tuple(self._ver.get(base, 0) for base, _, _ in spans)
        cached: Any = self._lookups.get((id(content), max_blocks))
        if cached is not None and cached[0] is content and cached[1] == versions:
            # no key of these labels was added or evicted since: the same blocks match (a waiting
            # head is looked up every step, as in vLLM; this only skips recomputing an unchanged answer)
            hits = cached[2]
        else:
            get = self.key_to_block.get
            hits = []
            for base, lo, hi in spans:
                found = list(map(get, range(base + lo, base + hi)))
                try:
                    j = found.index(None)
                except ValueError:
                    hits.extend(found)  # type: ignore[arg-type]
                    continue
                hits.extend(found[:j])  # type: ignore[arg-type]
                break
            if len(self._lookups) > 4096:
                self._lookups.clear()
            cached = (content, versions, hits, np.array(hits, dtype=np.int64))
            self._lookups[(id(content), max_blocks)] = cached
        arr = cached[3]
        result.hit_blocks = len(hits)
        if hits:
            result.hit_free_blocks = int(np.count_nonzero(self.ref[arr] == 0))
        result.blocks = hits  # shared with the cache: never mutated (allocate only reads it)
        result.block_array = arr
        result.offload_blocks = self.offload.contains_run(
            content, result.hit_blocks, max_blocks, self.block_size
        )
        return result

    def _drop_stale(self) -> None:
        """Rewrite the queue without its stale entries (order of the valid ones unchanged)."""
        n = self.num_blocks
        arr = np.array(self._q[self._head :], dtype=np.int64)
        blocks = arr % n
        valid = (self.ref[blocks] == 0) & (self.stamp[blocks] == arr // n)
        self._q = arr[valid].tolist()
        self._head = 0
        self._stale = 0

    def _pop_free(self, need: int) -> list[int]:
        """The first ``need`` valid entries of the queue, in order (their blocks)."""
        n = self.num_blocks
        q = self._q
        ref = self.ref
        stamp = self.stamp
        out: list[int] = []
        if need <= 16:
            # a few entries: scan them in Python; stale entries (touched blocks) fall to the numpy path
            head = self._head
            stop = min(len(q), head + 32)
            while len(out) < need and head < stop:
                e = q[head]
                head += 1
                b = e % n
                if ref[b] == 0 and stamp[b] == e // n:
                    out.append(b)
            self._head = head
        if len(out) < need:
            while len(out) < need:
                k = max(64, 2 * (need - len(out)))
                chunk = np.array(q[self._head : self._head + k], dtype=np.int64)
                blocks = chunk % n
                idx = np.flatnonzero((ref[blocks] == 0) & (stamp[blocks] == chunk // n))
                want = need - len(out)
                if len(idx) > want:
                    self._head += int(idx[want])  # the first valid entry not taken is the new head
                    idx = idx[:want]
                else:
                    self._head += len(chunk)
                out.extend(blocks[idx].tolist())
        if self._head > 4096 and self._head * 2 > len(q):
            del q[: self._head]
            self._head = 0
        return out

    def allocate(
        self,
        table: BlockTable,
        content: Content,
        hit: Lookup | None,
        total_blocks: int,
        cacheable_blocks: int,
    ) -> bool:
        if hit is None and total_blocks <= len(table.blocks):
            if cacheable_blocks > table.keyed:
                self.cache_upto(table, content, cacheable_blocks)
            return True
        n_hit = hit.hit_blocks if hit is not None else 0
        need = total_blocks - len(table.blocks) - n_hit
        evictable_hits = hit.hit_free_blocks if hit is not None else 0
        if need > self._free - evictable_hits:
            return False
        ref = self.ref
        if n_hit:
            assert hit is not None and hit.blocks is not None
            arr = hit.block_array if hit.block_array is not None else np.array(hit.blocks, dtype=np.int64)
            n_free_hits = int(np.count_nonzero(ref[arr] == 0))
            self._free -= n_free_hits
            self._cached_free -= n_free_hits
            self._stale += n_free_hits
            ref[arr] += 1
            if self._stale > 8192 and 2 * self._stale > len(self._q) - self._head:
                self._drop_stale()
            table.blocks.extend(hit.blocks)
            table.num_blocks = len(table.blocks)
            table.keyed = n_hit
        if need > 0:
            taken = self._pop_free(need)
            self._free -= need
            if need <= 16:
                keyed = self.keyed
                evicted = [b for b in taken if keyed[b]]
                for b in taken:
                    ref[b] = 1
            else:
                arr = np.array(taken, dtype=np.int64)
                evicted = arr[self.keyed[arr]].tolist()
                ref[arr] = 1
            if evicted:
                if len(evicted) <= 8:
                    keys = [int(self.key[b]) for b in evicted]
                    for b in evicted:
                        self.keyed[b] = False
                        self.key[b] = -1
                else:
                    ev = np.array(evicted, dtype=np.int64)
                    keys = self.key[ev].tolist()
                    self.keyed[ev] = False
                    self.key[ev] = -1
                deque(map(self.key_to_block.__delitem__, keys), 0)
                ver = self._ver
                for base in {k >> 32 << 32 for k in keys}:
                    ver[base] = ver.get(base, 0) + 1
                self._evictions += len(keys)
                self._cached_free -= len(keys)
                if self.watch is not None:
                    for k in keys:
                        i = k & 0xFFFFFFFF
                        self.watch.evicted_keys(self.label_of[k >> 32], i, i + 1)
                if self.offload.capacity > 0:
                    for k in keys:
                        self.offload.put(self.external_key(k))
            table.blocks.extend(taken)
        table.num_blocks = len(table.blocks)
        self.cache_upto(table, content, cacheable_blocks)
        return True

    def cache_upto(self, table: BlockTable, content: Content, cacheable_blocks: int) -> None:
        upto = min(cacheable_blocks, len(table.blocks))
        if upto <= table.keyed:
            return
        k2b = self.key_to_block
        blocks = table.blocks
        if upto - table.keyed == 1:
            # one block (a decode step filled it): same result as the general path, without the generators
            i = table.keyed
            for label, _lo, _hi in content.spans(i, upto, self.block_size):
                base = self._base(label)
                k = base + i
                if k not in k2b:
                    b = blocks[i]
                    k2b[k] = b
                    self.key[b] = k
                    self.keyed[b] = True
                    self._ver[base] = self._ver.get(base, 0) + 1
                    if self.watch is not None:
                        self.watch.keyed(label, i, i + 1)
            table.keyed = upto
            return
        for label, lo, hi in content.spans(table.keyed, upto, self.block_size):
            base = self._base(label)
            keys = range(base + lo, base + hi)
            bids = blocks[lo:hi]
            if any(map(k2b.__contains__, keys)):
                pairs = [(k, b) for k, b in zip(keys, bids, strict=True) if k not in k2b]
                if not pairs:
                    continue
                keys, bids = zip(*pairs, strict=True)  # type: ignore[assignment]
            k2b.update(zip(keys, bids, strict=True))
            self._ver[base] = self._ver.get(base, 0) + 1
            if self.watch is not None:
                if isinstance(keys, range):
                    self.watch.keyed(label, lo, hi)
                else:
                    for k in keys:
                        self.watch.keyed(label, k - base, k - base + 1)
            if len(bids) <= 8:
                key, keyed = self.key, self.keyed
                for k, b in zip(keys, bids, strict=True):
                    key[b] = k
                    keyed[b] = True
            else:
                arr = np.array(bids, dtype=np.int64)
                self.key[arr] = np.array(keys, dtype=np.int64)
                self.keyed[arr] = True
        table.keyed = upto

    def free(self, table: BlockTable) -> None:
        if table.blocks:
            arr = np.array(table.blocks[::-1], dtype=np.int64)
            ref = self.ref
            ref[arr] -= 1
            zero = arr[ref[arr] == 0]
            if len(zero):
                stamp = self._next_stamp
                self._next_stamp += 1
                self.stamp[zero] = stamp
                self._q.extend((zero + stamp * self.num_blocks).tolist())
                self._free += len(zero)
                self._cached_free += int(np.count_nonzero(self.keyed[zero]))
        table.blocks = []
        table.num_blocks = 0
        table.keyed = 0

    def reset(self) -> bool:
        if self._free != self.num_blocks:
            return False
        self.key_to_block.clear()
        self._lookups.clear()
        self._ver = {base: v + 1 for base, v in self._ver.items()}
        self.key[:] = -1
        self.keyed[:] = False
        self._cached_free = 0
        if self.watch is not None:
            self.watch.flushed()
        return True

    # ---- for tests
    def free_blocks_in_order(self) -> list[int]:
        n = self.num_blocks
        out = []
        for e in self._q[self._head :]:
            b = e % n
            if self.ref[b] == 0 and self.stamp[b] == e // n:
                out.append(b)
        return out

    def queue_keys(self) -> list[Hashable | None]:
        """The free queue as keys ``(label, index)`` in eviction order (None for unkeyed blocks)."""
        return [
            self.external_key(int(self.key[b])) if self.keyed[b] else None
            for b in self.free_blocks_in_order()
        ]

    def check(self) -> None:
        """Invariants: every block exactly once free or in use; keys and index agree."""
        free = self.free_blocks_in_order()
        assert len(free) == len(set(free)) == self._free
        in_use = int(np.count_nonzero(self.ref > 0))
        assert in_use + self._free == self.num_blocks
        assert bool((self.ref >= 0).all())
        for k, b in self.key_to_block.items():
            assert self.key[b] == k and self.keyed[b]
        assert int(np.count_nonzero(self.keyed)) == len(self.key_to_block)
        assert sum(1 for b in free if self.keyed[b]) == self._cached_free


# ---------------------------------------------------------------------- run-length
class Seg:
    """A run of blocks: keyed ``(label, i)`` for i in [lo, hi), or ``n`` unkeyed blocks (label None).

    Free segs (``ref == 0``) are in the queue; their blocks leave it from ``hi - 1`` down.
    """

    __slots__ = ("label", "lo", "hi", "ref")

    def __init__(self, label: Hashable | None, lo: int, hi: int, ref: int) -> None:
        self.label = label
        self.lo = lo
        self.hi = hi
        self.ref = ref

    def __repr__(self) -> str:
        return f"Seg({self.label!r}, {self.lo}, {self.hi}, ref={self.ref})"


@dataclass(eq=False)
class RunTable:
    runs: list[list]  # [label or None, lo, hi] in chain order
    num_blocks: int = 0
    keyed: int = 0  # chain positions [0, keyed) are in runs; the rest are unkeyed extras


class RunPool:
    """Run-length pool with the same behaviour as ``BlockPool``."""

    def __init__(self, num_blocks: int, block_size: int, offload_blocks: int = 0) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.queue: OrderedDict[Seg, None] = OrderedDict()
        self.index: dict[Hashable, list[Seg]] = {}
        self._free = num_blocks
        self._cached_free = 0
        self._cached = 0
        self._evictions = 0
        self.offload = _OffloadTier(offload_blocks)
        self.queue[Seg(None, 0, num_blocks, 0)] = None
        self.watch: Any = None

    def num_free(self) -> int:
        return self._free

    def num_cached_free(self) -> int:
        return self._cached_free

    def num_cached(self) -> int:
        return self._cached

    def evictions(self) -> int:
        return self._evictions

    def offload_count(self) -> int:
        return len(self.offload.keys)

    def new_table(self) -> RunTable:
        return RunTable([])

    # ---- index helpers
    def _segs_from(self, label: Hashable, lo: int) -> tuple[list[Seg] | None, int]:
        segs = self.index.get(label)
        if not segs:
            return None, 0
        for j, s in enumerate(segs):
            if s.hi > lo:
                return segs, j
        return segs, len(segs)

    def lookup(self, content: Content, max_blocks: int) -> Lookup:
        result = Lookup()
        for label, lo, hi in content.spans(0, max_blocks, self.block_size):
            segs, j = self._segs_from(label, lo)
            pos = lo
            if segs is not None:
                while pos < hi and j < len(segs) and segs[j].lo <= pos:
                    s = segs[j]
                    take = min(hi, s.hi) - pos
                    result.hit_blocks += take
                    if s.ref == 0:
                        result.hit_free_blocks += take
                    pos += take
                    j += 1
            if pos < hi:
                break
        result.offload_blocks = self.offload.contains_run(
            content, result.hit_blocks, max_blocks, self.block_size
        )
        return result

    def allocate(
        self, table: RunTable, content: Content, hit: Lookup | None, total_blocks: int, cacheable_blocks: int
    ) -> bool:
        if hit is None and total_blocks <= table.num_blocks:
            if cacheable_blocks > table.keyed:
                self.cache_upto(table, content, cacheable_blocks)
            return True
        n_hit = hit.hit_blocks if hit is not None else 0
        need = total_blocks - table.num_blocks - n_hit
        evictable_hits = hit.hit_free_blocks if hit is not None else 0
        if need > self._free - evictable_hits:
            return False
        if n_hit:
            self._touch(table, content, n_hit)
        if need > 0:
            self._evict(need)
            table.num_blocks += need
        self.cache_upto(table, content, cacheable_blocks)
        return True

    def _touch(self, table: RunTable, content: Content, n_hit: int) -> None:
        for label, lo, hi in content.spans(0, n_hit, self.block_size):
            segs = self.index[label]
            j = 0
            while segs[j].hi <= lo:
                j += 1
            pos = lo
            while pos < hi:
                s = segs[j]
                # path labels: a label's blocks start where its span starts, so no seg straddles pos
                assert s.lo == pos, (s, pos)
                if s.hi > hi:
                    # only [s.lo, hi) is touched; s keeps the part above, and its queue place if free
                    lower = Seg(label, s.lo, hi, s.ref + 1)
                    if s.ref == 0:
                        self._free -= hi - s.lo
                        self._cached_free -= hi - s.lo
                    s.lo = hi
                    segs.insert(j, lower)
                    break
                if s.ref == 0:
                    del self.queue[s]
                    self._free -= s.hi - s.lo
                    self._cached_free -= s.hi - s.lo
                s.ref += 1
                pos = s.hi
                j += 1
            self._merge_used(segs)
            table.runs.append([label, lo, hi])
        table.num_blocks += n_hit
        table.keyed = n_hit

    def _merge_used(self, segs: list[Seg]) -> None:
        j = 0
        while j + 1 < len(segs):
            a, b = segs[j], segs[j + 1]
            if a.ref > 0 and a.ref == b.ref and a.hi == b.lo:
                a.hi = b.hi
                del segs[j + 1]
            else:
                j += 1

    def _evict(self, need: int) -> None:
        queue = self.queue
        while need > 0:
            s = next(iter(queue))
            n = s.hi - s.lo
            take = min(n, need)
            need -= take
            self._free -= take
            if s.label is None:
                s.hi -= take
            else:
                self._cached_free -= take
                self._cached -= take
                self._evictions += take
                if self.offload.capacity > 0:
                    for i in range(s.hi - 1, s.hi - 1 - take, -1):
                        self.offload.put((s.label, i))
                if self.watch is not None:
                    self.watch.evicted_keys(s.label, s.hi - take, s.hi)
                s.hi -= take
            if s.hi == s.lo:
                del queue[s]
                if s.label is not None:
                    segs = self.index[s.label]
                    segs.remove(s)
                    if not segs:
                        del self.index[s.label]

    def cache_upto(self, table: RunTable, content: Content, cacheable_blocks: int) -> None:
        upto = min(cacheable_blocks, table.num_blocks)
        if upto <= table.keyed:
            return
        covered = table.keyed
        for label, lo, hi in content.spans(table.keyed, upto, self.block_size):
            if lo > covered:
                self._table_add(table, None, covered, lo)
            covered = hi
            segs = self.index.get(label)
            if segs is None:
                segs = self.index[label] = []
            pos = lo
            j = 0
            while pos < hi:
                while j < len(segs) and segs[j].hi <= pos:
                    j += 1
                if j < len(segs) and segs[j].lo <= pos:
                    # already cached elsewhere: our block stays unkeyed
                    end = min(hi, segs[j].hi)
                    self._table_add(table, None, pos, end)
                    pos = end
                    continue
                end = hi if j >= len(segs) else min(hi, segs[j].lo)
                if j > 0 and segs[j - 1].ref == 1 and segs[j - 1].hi == pos:
                    segs[j - 1].hi = end
                else:
                    segs.insert(j, Seg(label, pos, end, 1))
                    j += 1
                self._cached += end - pos
                if self.watch is not None:
                    self.watch.keyed(label, pos, end)
                self._table_add(table, label, pos, end)
                pos = end
            if not segs:
                del self.index[label]
        if covered < upto:
            # blocks the content does not describe stay unkeyed
            self._table_add(table, None, covered, upto)
        table.keyed = upto

    @staticmethod
    def _table_add(table: RunTable, label: Hashable | None, lo: int, hi: int) -> None:
        runs = table.runs
        if runs and runs[-1][0] == label and runs[-1][2] == lo:
            runs[-1][2] = hi
        else:
            runs.append([label, lo, hi])

    def free(self, table: RunTable) -> None:
        extras = table.num_blocks - table.keyed
        if extras > 0:
            self._append_unkeyed(extras)
        for label, lo, hi in reversed(table.runs):
            if label is None:
                self._append_unkeyed(hi - lo)
                continue
            segs = self.index[label]
            # segs covering [lo, hi), highest first
            j = len(segs) - 1
            while segs[j].lo >= hi:
                j -= 1
            if segs[j].hi > hi:
                self._split_used(segs, j, hi)
            while j >= 0 and segs[j].hi > lo:
                s = segs[j]
                if s.lo < lo:
                    self._split_used(segs, j, lo)
                    j += 1
                    s = segs[j]
                s.ref -= 1
                if s.ref == 0:
                    self._append_free(s, segs, j)
                j -= 1
            self._merge_used(segs)
        table.runs = []
        table.num_blocks = 0
        table.keyed = 0

    @staticmethod
    def _split_used(segs: list[Seg], j: int, at: int) -> None:
        s = segs[j]
        upper = Seg(s.label, at, s.hi, s.ref)
        s.hi = at
        segs.insert(j + 1, upper)

    def _append_unkeyed(self, n: int) -> None:
        queue = self.queue
        self._free += n
        if queue:
            last = next(reversed(queue))
            if last.label is None:
                last.hi += n
                return
        queue[Seg(None, 0, n, 0)] = None

    def _append_free(self, s: Seg, segs: list[Seg], j: int) -> None:
        n = s.hi - s.lo
        self._free += n
        self._cached_free += n
        queue = self.queue
        if queue:
            last = next(reversed(queue))
            # freed descending: the queue's last run continues below into s
            if last.label == s.label and last.lo == s.hi and last.label is not None:
                last.lo = s.lo
                del segs[j]
                return
        queue[s] = None

    def reset(self) -> bool:
        if self._free != self.num_blocks:
            return False
        self.queue.clear()
        self.index.clear()
        self.queue[Seg(None, 0, self.num_blocks, 0)] = None
        self._cached = 0
        self._cached_free = 0
        if self.watch is not None:
            self.watch.flushed()
        return True

    def queue_keys(self) -> list[Hashable | None]:
        out: list[Hashable | None] = []
        for s in self.queue:
            if s.label is None:
                out.extend([None] * (s.hi - s.lo))
            else:
                out.extend((s.label, i) for i in range(s.hi - 1, s.lo - 1, -1))
        return out

    def check(self) -> None:
        free = sum(s.hi - s.lo for s in self.queue)
        assert free == self._free, (free, self._free)
        assert all(s.ref == 0 and s.hi > s.lo for s in self.queue if s.label is not None)
        cached = 0
        cached_free = 0
        in_queue = set(self.queue)
        for label, segs in self.index.items():
            assert segs, label
            for a, b in zip(segs, segs[1:], strict=False):
                assert a.hi <= b.lo, (label, segs)
            for s in segs:
                assert s.label == label and s.hi > s.lo and s.ref >= 0
                cached += s.hi - s.lo
                if s.ref == 0:
                    assert s in in_queue, s
                    cached_free += s.hi - s.lo
                else:
                    assert s not in in_queue
        assert cached == self._cached, (cached, self._cached)
        assert cached_free == self._cached_free


def make_pool(mode: str, num_blocks: int, block_size: int, offload_blocks: int = 0) -> BlockPool | RunPool:
    if mode == "exact":
        return BlockPool(num_blocks, block_size, offload_blocks)
    return RunPool(num_blocks, block_size, offload_blocks)
