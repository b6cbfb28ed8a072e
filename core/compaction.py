"""The compaction gate: may a context store rewrite (compact) these shared prompt prefixes now?

Pure code: no I/O, clock passed in. Used by the sidecar (``POST /compaction/requests``)
and by the simulator's RAG compaction experiment.

Compacting a *subtree* (a shared prompt prefix such as system prompt + retrieved
documents) rewrites it and so invalidates every cached KV block below the
rewrite. The seed rule of the project: decisions depend on token-weighted
reuse, warmth and operator state, **never on request counts**.

Rules of ``decide_compaction`` (first match wins, per target subtree):

1. An operator deferral in force (``now < deferred_until``) defers every target.
2. ``urgency="storage-pressure"``: grant every target except the top-K hottest
   subtrees (hotness = cached tokens served from the subtree within the warmth
   window; only subtrees with hotness > 0 are eligible), which stay pinned and
   are deferred. This holds even in the thin-reuse regime.
3. ``urgency="normal"``: while the thin-reuse regime holds and *any* target is
   warm, defer every target. Otherwise defer warm targets, and cold ones with a
   turn in flight (that turn is loading the subtree's blocks now: a rewrite would
   throw its prefill away and make the next turn miss again); grant the rest.

A subtree the tracker has never seen is cold (no cached blocks to lose). A turn is
in flight from ``SubtreeTracker.begin`` to ``SubtreeTracker.end``; one not ended
within the warmth window stops counting (a lost end cannot defer a subtree forever).

API::

    tracker = SubtreeTracker(WarmthConfig(window_s=120.0, floor=3))
    tracker.begin("rag-docs-1", now)              # a turn went to the engine
    tracker.end("rag-docs-1")                     # ... and finished or failed
    tracker.record("rag-docs-1", now, prompt_tokens=6400, cached_tokens=6000)
    stats = tracker.stats(now)                    # dict[str, SubtreeStats]
    decisions = decide_compaction(
        ["rag-docs-1", "rag-docs-2"], stats,
        regime="thin-reuse", urgency="normal", now=now,
        deferred_until=None, policy=CompactionPolicy(top_k_pinned=2),
    )                                             # list[SubtreeDecision], one per target, in order
    [(d.subtree_id, d.decision, d.reason) for d in decisions]
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Urgency = Literal["normal", "storage-pressure"]
URGENCIES: tuple[Urgency, ...] = ("normal", "storage-pressure")
Decision = Literal["granted", "deferred"]


class CompactionConfigError(ValueError):
    """A compaction setting or request is invalid; the message names the field and value."""


@dataclass(frozen=True, slots=True)
class WarmthConfig:
    """A subtree is warm when it had at least ``floor`` cache hits within the last ``window_s`` seconds."""

    window_s: float = 120.0
    floor: int = 3

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise CompactionConfigError(f"window_s must be a finite number > 0, got {self.window_s!r}")
        if self.floor < 1:
            raise CompactionConfigError(f"floor must be >= 1, got {self.floor!r}")


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """``top_k_pinned``: hottest subtrees kept (deferred) under storage pressure."""

    top_k_pinned: int = 3

    def __post_init__(self) -> None:
        if self.top_k_pinned < 0:
            raise CompactionConfigError(f"top_k_pinned must be >= 0, got {self.top_k_pinned!r}")


@dataclass(frozen=True, slots=True)
class SubtreeStats:
    """What the gate knows of one subtree.

    ``turns``, ``prompt_tokens``, ``cached_tokens`` are lifetime totals (known turns
    only for the token counts); ``recent_hits`` and ``recent_cached_tokens`` cover the
    warmth window. ``warm`` is ``recent_hits >= floor``. ``in_flight``: turns begun and not
    ended, at most one warmth window old.
    """

    subtree_id: str
    turns: int
    prompt_tokens: int
    cached_tokens: int
    recent_hits: int
    recent_cached_tokens: int
    recent_prompt_tokens: int
    warm: bool
    last_seen: float
    in_flight: int = 0

    @property
    def token_weighted(self) -> float | None:
        if self.prompt_tokens <= 0:
            return None
        return self.cached_tokens / self.prompt_tokens

    @property
    def recent_token_weighted(self) -> float | None:
        if self.recent_prompt_tokens <= 0:
            return None
        return self.recent_cached_tokens / self.recent_prompt_tokens

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.subtree_id,
            "turns": self.turns,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "token_weighted": self.token_weighted,
            "recent_hits": self.recent_hits,
            "recent_cached_tokens": self.recent_cached_tokens,
            "recent_prompt_tokens": self.recent_prompt_tokens,
            "recent_token_weighted": self.recent_token_weighted,
            "warm": self.warm,
            "last_seen": self.last_seen,
            "in_flight": self.in_flight,
        }


@dataclass(frozen=True, slots=True)
class SubtreeDecision:
    subtree_id: str
    decision: Decision
    reason: str
    warm: bool
    recent_hits: int
    recent_cached_tokens: int


@dataclass(slots=True)
class _Subtree:
    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    last_seen: float = 0.0
    # (t, prompt_tokens, cached_tokens or -1 for unknown) within the warmth window
    recent: deque[tuple[float, int, int]] | None = None
    # start times of turns in flight (begin ... end), oldest first
    started: deque[float] | None = None


class SubtreeTracker:
    """Per-subtree turns, tokens and warmth. Keeps at most ``max_subtrees`` (least recently seen dropped)."""

    def __init__(self, warmth: WarmthConfig | None = None, max_subtrees: int = 10_000) -> None:
        if max_subtrees < 1:
            raise CompactionConfigError(f"max_subtrees must be >= 1, got {max_subtrees!r}")
        self.warmth = warmth or WarmthConfig()
        self.max_subtrees = max_subtrees
        self._subtrees: OrderedDict[str, _Subtree] = OrderedDict()

    def _entry(self, subtree_id: str) -> _Subtree:
        sub = self._subtrees.get(subtree_id)
        if sub is None:
            sub = _Subtree(recent=deque(), started=deque())
            self._subtrees[subtree_id] = sub
            while len(self._subtrees) > self.max_subtrees:
                self._subtrees.popitem(last=False)
        else:
            self._subtrees.move_to_end(subtree_id)
        return sub

    def begin(self, subtree_id: str, now: float) -> None:
        """A turn under ``subtree_id`` went to the engine: in flight until ``end`` (or one warmth window)."""
        started = self._entry(subtree_id).started
        assert started is not None
        started.append(now)

    def end(self, subtree_id: str) -> None:
        """A turn begun under ``subtree_id`` finished or failed (a finished one is also ``record``-ed)."""
        sub = self._subtrees.get(subtree_id)
        if sub is not None and sub.started:
            sub.started.popleft()

    def record(self, subtree_id: str, now: float, prompt_tokens: int, cached_tokens: int | None) -> None:
        """One completed turn under ``subtree_id``; ``cached_tokens=None`` is unknown (not a miss)."""
        sub = self._entry(subtree_id)
        prompt = max(0, int(prompt_tokens))
        sub.turns += 1
        sub.last_seen = max(sub.last_seen, now)
        if cached_tokens is not None:
            cached = min(prompt, max(0, int(cached_tokens)))
            sub.prompt_tokens += prompt
            sub.cached_tokens += cached
        else:
            cached = -1
        assert sub.recent is not None
        sub.recent.append((now, prompt, cached))
        self._expire(sub, now)

    def _expire(self, sub: _Subtree, now: float) -> None:
        assert sub.recent is not None and sub.started is not None
        window_s = self.warmth.window_s
        while sub.recent and now - sub.recent[0][0] >= window_s:
            sub.recent.popleft()
        while sub.started and now - sub.started[0] >= window_s:
            sub.started.popleft()

    def stats(self, now: float) -> dict[str, SubtreeStats]:
        return {sid: self._stats_of(sid, sub, now) for sid, sub in self._subtrees.items()}

    def get(self, subtree_id: str, now: float) -> SubtreeStats | None:
        sub = self._subtrees.get(subtree_id)
        return None if sub is None else self._stats_of(subtree_id, sub, now)

    def _stats_of(self, sid: str, sub: _Subtree, now: float) -> SubtreeStats:
        self._expire(sub, now)
        assert sub.recent is not None and sub.started is not None
        hits = cached = prompt = 0
        for _, p, c in sub.recent:
            if c < 0:
                continue
            prompt += p
            cached += c
            hits += int(c > 0)
        return SubtreeStats(
            subtree_id=sid,
            turns=sub.turns,
            prompt_tokens=sub.prompt_tokens,
            cached_tokens=sub.cached_tokens,
            recent_hits=hits,
            recent_cached_tokens=cached,
            recent_prompt_tokens=prompt,
            warm=hits >= self.warmth.floor,
            last_seen=sub.last_seen,
            in_flight=len(sub.started),
        )

    def __len__(self) -> int:
        return len(self._subtrees)


def _cold(subtree_id: str) -> SubtreeStats:
    return SubtreeStats(subtree_id, 0, 0, 0, 0, 0, 0, False, 0.0)


def pinned_subtrees(subtrees: Mapping[str, SubtreeStats], top_k: int) -> list[str]:
    """The top-K hottest subtrees by recent cached tokens (ties by id), only those with any."""
    hot = [s for s in subtrees.values() if s.recent_cached_tokens > 0]
    hot.sort(key=lambda s: (-s.recent_cached_tokens, s.subtree_id))
    return [s.subtree_id for s in hot[:top_k]]


def decide_compaction(
    targets: Sequence[str],
    subtrees: Mapping[str, SubtreeStats],
    *,
    regime: str,
    urgency: Urgency,
    now: float,
    deferred_until: float | None,
    policy: CompactionPolicy | None = None,
) -> list[SubtreeDecision]:
    """One decision per target (in the order given; duplicates decided once each). See the module doc.

    ``regime`` is ``"thin-reuse"`` or ``"normal"`` (core.reuse). ``deferred_until``
    is the end of an operator deferral (same clock as ``now``) or None.
    """
    if urgency not in URGENCIES:
        raise CompactionConfigError(f"urgency must be one of {', '.join(URGENCIES)}, got {urgency!r}")
    policy = policy or CompactionPolicy()
    stats = [subtrees.get(t) or _cold(t) for t in targets]

    def decision(s: SubtreeStats, verdict: Decision, reason: str) -> SubtreeDecision:
        return SubtreeDecision(s.subtree_id, verdict, reason, s.warm, s.recent_hits, s.recent_cached_tokens)

    if deferred_until is not None and now < deferred_until:
        return [
            decision(s, "deferred", f"operator deferral in force until {deferred_until:.3f}") for s in stats
        ]

    if urgency == "storage-pressure":
        pinned = set(pinned_subtrees(subtrees, policy.top_k_pinned))
        out = []
        for s in stats:
            if s.subtree_id in pinned:
                out.append(
                    decision(
                        s,
                        "deferred",
                        f"storage pressure: pinned as one of the top {policy.top_k_pinned} hottest subtrees "
                        f"({s.recent_cached_tokens} cached tokens recently)",
                    )
                )
            else:
                out.append(decision(s, "granted", "storage pressure: not among the hottest subtrees"))
        return out

    warm = [s.subtree_id for s in stats if s.warm]
    if regime == "thin-reuse" and warm:
        names = ", ".join(sorted(set(warm)))
        return [
            decision(s, "deferred", f"thin-reuse regime and warm target(s): {names}; deferring all")
            for s in stats
        ]
    return [
        decision(s, "deferred", f"warm: {s.recent_hits} recent cache hits (floor reached)")
        if s.warm
        else decision(
            s,
            "deferred",
            f"cold ({s.recent_hits} recent cache hits) but {s.in_flight} turn(s) in flight loading its blocks",
        )
        if s.in_flight > 0
        else decision(s, "granted", f"cold: {s.recent_hits} recent cache hits")
        for s in stats
    ]
