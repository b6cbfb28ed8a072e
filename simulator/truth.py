"""Ground truth of why each missing prompt block was missing (issue 16 item 2's check).

Off by default: an engine without a `Watch` pays one ``is None`` test per admission, eviction and
keying. With one (``Engine.set_watch``), the pool reports every key it keys and evicts, and the engine
reports each request's lookup just before its first admission, and its computed extent when it stops
(finish, preemption, abort). The model running the workload tells the watch the rest: how to classify
an eviction when it happens (``classify``: was the owning session parked, was demand above the pool),
which labels replaced which (``rewrite``: compaction), and which request group a request belongs to
(``group``: its session or subtree; None for one-off requests).

Per label (a path label of ``simulator.content``), one byte per block index: ``NEVER`` (never keyed),
``CACHED`` (keyed now), or the eviction code it was last evicted with (``PARKED``, ``PRESSURE``,
``OTHER``, ``FLUSH``). Per label also the furthest token position any request computed (``extent``):
a block never keyed although some of its tokens were computed was a partial block then.

At a request's first admission its uncached prompt tokens (from the lookup's end to the prompt's end)
are split into the `core.attribution` causes, the ground truth:

* a full block last evicted while its owner was parked: ``evicted-parked``; while demand was above
  the pool: ``evicted-pressure``; otherwise (LRU churn with demand below the pool, a flush):
  ``unattributed`` (counted apart as ``evicted-other`` / ``flushed`` in ``detail``);
* a block never keyed whose label replaced one that had it keyed: ``prefix-changed``;
* tokens computed before only as part of a partial block: ``partial-block``;
* tokens never computed: ``cold`` for the first admitted request of its group (or a request with no
  group), else ``new``;
* blocks still cached behind the first missing one (unreachable: a prefix hit stops at the first
  miss) take the first missing block's cause; a cached block the lookup may not use (the prompt's
  last token is always computed) is ``partial-block``.

The parts add up to ``prompt_tokens - cached_tokens`` exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

NEVER = 0
CACHED = 1
PARKED = 2
PRESSURE = 3
OTHER = 4
FLUSH = 5
EVICTION_CODES = {"parked": PARKED, "pressure": PRESSURE, "other": OTHER}
_CAUSE_OF = {
    PARKED: "evicted-parked",
    PRESSURE: "evicted-pressure",
    OTHER: "unattributed",
    FLUSH: "unattributed",
}
_DETAIL_OF = {OTHER: "evicted-other", FLUSH: "flushed"}
_FLUSHED = bytes(FLUSH if c == CACHED else c for c in range(256))


def _add(out: dict[str, int], cause: str, n: int) -> None:
    if n > 0:
        out[cause] = out.get(cause, 0) + n


class Watch:
    """Records why blocks go missing; see the module doc. Attach with ``Engine.set_watch``."""

    def __init__(
        self,
        block_size: int = 16,
        classify: Callable[[Hashable], str] | None = None,
        group: Callable[[Any], Hashable | None] | None = None,
    ) -> None:
        self.block_size = block_size
        self.classify = classify or (lambda label: "other")
        self.group = group or (lambda req: None)
        self.codes: dict[Hashable, bytearray] = {}
        self.extent: dict[Hashable, int] = {}
        self.replaced: dict[Hashable, Hashable] = {}
        self.seen_groups: set[Hashable] = set()
        self.evicted = dict.fromkeys(("parked", "pressure", "other", "flush"), 0)
        self.trace: list[dict[str, Any]] = []
        """Every finished request as the sidecar's turn trace records it, plus ``truth``."""
        self.samples: list[tuple[float, float]] = []
        """``(t, demand / pool)`` each simulated second, as the sidecar's ``demand_fraction``."""
        self.prefix_changes: dict[str, list[float]] = {}
        """Per subtree, the times it was compacted (the granted compaction decisions)."""

    # ------------------------------------------------------------------ the trace
    def turn(
        self,
        req: Any,
        now: float,
        session: str | None,
        subtree: str | None,
        held_s: float,
        parked_s: float,
        latency_s: float,
    ) -> None:
        """``req`` finished at ``now``: one row of the turn trace (`docs/turns.md`'s fields)."""
        causes, detail = req.truth if req.truth is not None else ({}, {})
        self.trace.append(
            {
                "id": len(self.trace) + 1,
                "ts": now,
                "session": session,
                "subtree": subtree,
                "prompt_tokens": req.prompt_tokens,
                "cached_tokens": min(req.cached_tokens or 0, req.prompt_tokens),
                "completion_tokens": req.output,
                "held_s": held_s,
                "parked_s": parked_s,
                "latency_s": latency_s,
                "outcome": "ok",
                "truth": causes,
                "truth_detail": detail,
            }
        )

    def sample(self, now: float, demand_fraction: float) -> None:
        self.samples.append((now, demand_fraction))

    # ------------------------------------------------------------------ from the pool
    def _codes(self, label: Hashable, hi: int) -> bytearray:
        codes = self.codes.get(label)
        if codes is None:
            codes = self.codes[label] = bytearray()
        if len(codes) < hi:
            codes.extend(bytes(hi - len(codes)))
        return codes

    def keyed(self, label: Hashable, lo: int, hi: int) -> None:
        """Keys ``(label, i)`` for i in [lo, hi) were keyed."""
        self._codes(label, hi)[lo:hi] = bytes([CACHED]) * (hi - lo)

    def evicted_keys(self, label: Hashable, lo: int, hi: int) -> None:
        """Keys ``(label, i)`` for i in [lo, hi) were evicted (now: the classifier says why)."""
        why = self.classify(label)
        self.evicted[why] += hi - lo
        self._codes(label, hi)[lo:hi] = bytes([EVICTION_CODES[why]]) * (hi - lo)

    def flushed(self) -> None:
        """The prefix cache was reset: every cached key is gone."""
        for label, codes in self.codes.items():
            n = codes.count(CACHED)
            if n:
                self.evicted["flush"] += n
                self.codes[label] = bytearray(codes.translate(_FLUSHED))

    # ------------------------------------------------------------------ from the model
    def rewrite(self, old: Hashable, new: Hashable) -> None:
        """Label ``new`` replaces ``old`` (a compaction rewrote the prefix it names)."""
        self.replaced[new] = old

    # ------------------------------------------------------------------ from the engine
    def stopped(self, content: Any, num_computed: int) -> None:
        """A request over ``content`` stops having computed ``num_computed`` tokens."""
        for label, start, end in getattr(content, "_bounds", ()):
            if start >= num_computed:
                break
            reach = min(end, num_computed)
            if reach > self.extent.get(label, 0):
                self.extent[label] = reach

    def lookup(self, req: Any, computed: int) -> tuple[dict[str, int], dict[str, int]] | None:
        """Why ``req``'s prompt tokens from ``computed`` on are missing: ``(causes, detail)``."""
        bounds = getattr(req.content, "_bounds", None)
        if bounds is None:
            return None
        group = self.group(req)
        never = "cold" if group is None or group not in self.seen_groups else "new"
        bs = self.block_size
        prompt = req.prompt_tokens
        out: dict[str, int] = {}
        detail: dict[str, int] = {}
        first = computed // bs
        cap = (prompt - 1) // bs  # the lookup's limit: the last prompt token is always computed
        full_end = prompt // bs
        unreachable = 0
        first_cause: str | None = None
        for label, lo, hi in req.content.spans(first, full_end, bs):
            codes = self.codes.get(label, b"")
            seg = bytes(codes[lo:hi])
            if len(seg) < hi - lo:
                seg += bytes(hi - lo - len(seg))
            if first_cause is None:
                first_cause = self._block_cause(label, lo, seg[0], cap, never)
            if hi > cap and seg[-1] == CACHED:  # the lookup may not use the prompt's last full block
                _add(out, "partial-block", bs)
                seg = seg[:-1]
                hi -= 1
            unreachable += seg.count(CACHED) * bs
            for code in (PARKED, PRESSURE, OTHER, FLUSH):
                n = seg.count(code) * bs
                _add(out, _CAUSE_OF[code], n)
                _add(detail, _DETAIL_OF.get(code, _CAUSE_OF[code]), n)
            n_never = seg.count(NEVER)
            if not n_never:
                continue
            older = self.replaced.get(label)
            if older is not None:
                changed = sum(
                    1 for i in range(lo, hi) if seg[i - lo] == NEVER and self._replaced_had(older, i)
                )
                _add(out, "prefix-changed", changed * bs)
                n_never -= changed
            # never keyed: computed before up to the label's extent (partial blocks then), or never
            ext = self.extent.get(label, 0)
            below = max(0, min(hi, ext // bs) - lo)
            done = seg[:below].count(NEVER) if older is None else 0
            part = done * bs
            j = ext // bs
            if older is None and lo <= j < hi and seg[j - lo] == NEVER:
                part += ext - j * bs
            _add(out, "partial-block", part)
            _add(out, never, n_never * bs - part)
        tail = prompt - max(full_end * bs, computed)
        if tail > 0:
            label = next(lab for lab, s, e in bounds if e >= prompt)
            part = min(tail, max(0, self.extent.get(label, 0) - full_end * bs))
            _add(out, "partial-block", part)
            _add(out, never, tail - part)
            if first_cause is None:
                first_cause = "partial-block" if part else never
        if unreachable:
            _add(out, first_cause or never, unreachable)
            _add(detail, "unreachable", unreachable)
        return out, detail

    def _block_cause(self, label: Hashable, i: int, code: int, cap: int, never: str) -> str:
        """The cause of block ``(label, i)`` alone (the first missing block: the chain breaks there)."""
        if code == CACHED:
            return "partial-block"
        if code != NEVER:
            return _CAUSE_OF[code]
        if self._replaced_had(self.replaced.get(label), i):
            return "prefix-changed"
        return "partial-block" if self.extent.get(label, 0) > i * self.block_size else never

    def _replaced_had(self, older: Hashable | None, i: int) -> bool:
        while older is not None:
            codes = self.codes.get(older)
            if codes is not None and i < len(codes) and codes[i] != NEVER:
                return True
            older = self.replaced.get(older)
        return False

    def admitted(self, req: Any, truth: tuple[dict[str, int], dict[str, int]] | None) -> None:
        """``req`` was admitted for the first time; ``truth`` is what `lookup` said just before."""
        req.truth = truth
        group = self.group(req)
        if group is not None:
            self.seen_groups.add(group)
