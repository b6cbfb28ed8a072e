"""Why prompt tokens were missed: each turn's uncached prompt tokens, split by cause. Pure.

A turn's *uncached* tokens are ``prompt_tokens - cached_tokens`` (turns whose engine did not
report ``cached_tokens`` are unknown, never misses, and get no attribution). They are split so
the parts always add up to the uncached count exactly:

1. ``cold``: the whole uncached count when nothing could have been cached yet: the first turn of a
   session, or a session-less turn whose subtree (prefix id) was never served before, fleet-wide.
2. Otherwise the turn has a *reusable prefix* ``r``: for a session, its previous turn's context
   as the engine holds it: previous prompt + previous completion - 1 (chat history is append-only;
   the last generated token's KV is never computed, the request ends when it is sampled); for a
   session-less turn of a known subtree, the longest cached count seen for that subtree (the
   shared prefix the engine has proven it can reuse; see `Attributor`). With ``p = prompt_tokens``, ``reach = min(r, p)`` and block
   size ``B``, the engine can at best reuse ``expected = floor(reach / B) * B`` tokens. Then, in
   this order, each part taking what is left of the uncached count:

   * ``new``: ``p - reach``, this turn's own new tokens (the user message, the tool result):
     nothing earlier could hold them. Not a miss to fix, but a share of ``1 - R_t`` all the same.
   * ``partial-block``: ``reach - expected``, the tail of the reusable prefix that does not fill
     a whole block and is always recomputed.
   * the rest (reusable tokens that were *not* found in the cache) goes to the first cause that
     applies, in this precedence (the earlier cause makes the later ones moot):

     - ``prefix-changed``: the turn's subtree was compacted or rewritten after the previous turn
       and before this one *started* (``ts - latency_s``: the prompt, and so the prefix it can
       reuse, is fixed when the turn is forwarded); every cached block below the rewrite is
       invalid whatever else happened;
     - ``routed-away``: the session's previous turn went through another sidecar of the fleet,
       so its prefix is cached, if anywhere, on another engine;
     - ``evicted-parked``: the session was parked between the two turns (parking lets the prefix
       go; that is its purpose, and the price of getting out of collapse);
     - ``evicted-pressure``: KV demand was above the pool at some moment between the two turns;
     - ``unattributed``: none of the above fits (an eviction the sidecar cannot explain, a
       prompt that is not an extension of the previous one, a restarted engine).

Preemption is not a per-turn cause: vLLM counts tokens recomputed after a preemption as prefix
hits, so its effect shows only in aggregate, as the engine's hit counter outrunning the
sidecar's cached tokens (`recomputed_hits`).

`Attributor` walks a fleet's turns in time order, keeping each session's previous turn and each
subtree's reusable length; the facts it cannot see in the turns themselves (compactions, demand
above the pool) come in as `Events`. All times are seconds on one clock.

Checked against the simulator's ground truth (``python -m simulator attribution-check``, measured
agreement in docs/turns.md).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

CAUSES: tuple[str, ...] = (
    "cold",
    "new",
    "partial-block",
    "prefix-changed",
    "routed-away",
    "evicted-parked",
    "evicted-pressure",
    "unattributed",
)
"""Every cause, in the order of the module doc (charts stack them in this order)."""

MISS_CAUSES: tuple[str, ...] = tuple(c for c in CAUSES if c not in ("new", "partial-block"))
"""The causes an operator can act on or should look into (what "missed" means on the pages)."""

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default KV block size in tokens, used when the engine does not report its own."""


@dataclass(frozen=True)
class Turn:
    """One completed turn, as the sidecar's turn trace records it (no prompt content)."""

    ts: float
    prompt_tokens: int
    cached_tokens: int | None
    completion_tokens: int = 0
    session: str | None = None
    subtree: str | None = None
    sidecar: str = ""
    parked_s: float = 0.0
    """Seconds this turn was held because its session was parked (0 when it was not)."""
    latency_s: float = 0.0
    """The engine's latency: the turn was forwarded at ``ts - latency_s`` (0 when unknown)."""

    @property
    def start(self) -> float:
        """When the turn was forwarded to the engine (its prompt, and reusable prefix, fixed)."""
        return self.ts - max(0.0, self.latency_s)

    @property
    def context(self) -> int:
        """Tokens of this turn's context the engine holds KV for once it finished: prompt +
        completion - 1 (the last sampled token is never computed), the prompt without completion."""
        return self.prompt_tokens + max(0, self.completion_tokens - 1)


@dataclass(frozen=True)
class Events:
    """What happened between turns that the turns themselves do not show."""

    prefix_changes: Mapping[str, Sequence[float]] = field(default_factory=dict)
    """Per subtree, sorted times at which it was compacted or rewritten."""
    pressure: Sequence[tuple[float, float]] = ()
    """Sorted, non-overlapping ``(start, end)`` intervals with KV demand above the pool."""

    def changed(self, subtree: str | None, after: float, until: float) -> bool:
        """Whether ``subtree`` was rewritten in ``(after, until)``: a turn forwarded at the very
        instant of a rewrite was built before it (the simulator's compaction job runs when a
        request arrives, after that request's prompt is made)."""
        times = self.prefix_changes.get(subtree, ()) if subtree is not None else ()
        i = bisect.bisect_right(times, after)
        return i < len(times) and times[i] < until

    def last_change(self, subtree: str | None, at: float) -> float | None:
        """The latest rewrite of ``subtree`` before ``at`` (None when none)."""
        times = self.prefix_changes.get(subtree, ()) if subtree is not None else ()
        i = bisect.bisect_left(times, at)
        return times[i - 1] if i else None

    def under_pressure(self, after: float, until: float) -> bool:
        i = bisect.bisect_left([end for _, end in self.pressure], after)
        return i < len(self.pressure) and self.pressure[i][0] <= until


def above_pool_intervals(
    series: Iterable[Sequence[tuple[float, float | None]]], limit: float = 1.0
) -> list[tuple[float, float]]:
    """`Events.pressure` from sampled ``demand / pool`` series: each sample above ``limit`` stands for
    the interval until the next sample of its series (the last one for its own instant); the
    intervals of every series sorted and merged (overlapping or touching ones become one)."""
    spans: list[tuple[float, float]] = []
    for points in series:
        for i, (ts, value) in enumerate(points):
            if value is None or value <= limit:
                continue
            spans.append((ts, points[i + 1][0] if i + 1 < len(points) else ts))
    spans.sort()
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def split_uncached(prompt: int, cached: int, reusable: int, block_size: int, cause: str) -> dict[str, int]:
    """Split ``prompt - cached`` into new, partial-block and ``cause`` (see the module doc)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    uncached = max(0, prompt - cached)
    reach = max(0, min(reusable, prompt))
    expected = reach // block_size * block_size
    out: dict[str, int] = {}
    for name, size in (("new", prompt - reach), ("partial-block", reach - expected), (cause, uncached)):
        take = min(uncached, max(0, size))
        if take:
            out[name] = out.get(name, 0) + take
        uncached -= take
    return out


def attribute(
    turn: Turn,
    previous: Turn | None,
    events: Events,
    *,
    subtree_seen: tuple[int, float] | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    prefix_changed: bool | None = None,
) -> dict[str, int]:
    """One turn's uncached tokens by cause.

    ``previous``: the session's previous turn, fleet-wide. ``subtree_seen``: for a session-less
    turn, its subtree's ``(reusable length, time last served)``, None when never served.
    ``prefix_changed``: whether the prefix was rewritten since it could last be reused, when the
    caller knows better (`Attributor`); by default, a rewrite after ``since`` and by ``turn.start``.
    """
    if turn.cached_tokens is None:
        return {}
    uncached = max(0, turn.prompt_tokens - turn.cached_tokens)
    if turn.session is not None and previous is not None:
        reusable = previous.context
        since = previous.ts
    elif turn.session is None and subtree_seen is not None:
        reusable, since = subtree_seen
    else:
        return {"cold": uncached} if uncached else {}
    if prefix_changed is None:
        prefix_changed = events.changed(turn.subtree, since, turn.start)
    if prefix_changed:
        cause = "prefix-changed"
    elif previous is not None and turn.session is not None and previous.sidecar != turn.sidecar:
        cause = "routed-away"
    elif turn.parked_s > 0:
        cause = "evicted-parked"
    elif events.under_pressure(since, turn.ts):
        cause = "evicted-pressure"
    else:
        cause = "unattributed"
    return split_uncached(turn.prompt_tokens, turn.cached_tokens, reusable, block_size, cause)


@dataclass
class _Version:
    """A subtree between two rewrites, as its session-less turns showed it."""

    first_done: float
    """When its first turn finished: turns started later could reuse what that one computed."""
    learnt: int | None = None
    """Longest cached count of its turns started after ``first_done`` (None: none yet)."""


_SubtreeSeen = tuple[float, int, dict[float | None, _Version]]
"""Per subtree: (time last served, its first turn's cached count, versions by rewrite time)."""


class Attributor:
    """Attributes a fleet's turns in time order (feed them sorted by ``ts``).

    A session-less turn belongs to the *version* of its subtree current when it started (the
    latest rewrite at or before ``start``). Its reusable length is the longest cached count seen
    among the turns of its version that started after the version's first turn finished (those
    could have found it cached); before any did, the latest earlier version's, else the cached
    count of the subtree's first turn. Its missing reusable tokens are ``prefix-changed`` while no
    turn of its version had finished when it started, unless it is the subtree's first version.
    """

    def __init__(self, events: Events | None = None, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.events = events or Events()
        self.block_size = block_size
        self._last: dict[str, Turn] = {}
        self._subtree: dict[str, _SubtreeSeen] = {}
        """Per subtree: (time last served, first turn's cached count, versions by rewrite time)."""

    def add(self, turn: Turn) -> dict[str, int]:
        previous = self._last.get(turn.session) if turn.session is not None else None
        seen = self._subtree.get(turn.subtree) if turn.subtree is not None else None
        if turn.session is None and seen is not None:
            out = self._sessionless(turn, seen)
        else:
            out = attribute(turn, previous, self.events, block_size=self.block_size)
        if turn.session is not None:
            self._last[turn.session] = turn
        if turn.subtree is not None:
            self._learn(turn, seen)
        return out

    def _sessionless(self, turn: Turn, seen: _SubtreeSeen) -> dict[str, int]:
        last_ts, first_cached, versions = seen
        at = self.events.last_change(turn.subtree, turn.start)
        version = versions.get(at)
        earlier = sorted((_order(k), v.learnt) for k, v in versions.items() if _before(k, at))
        if version is not None and version.learnt is not None:
            reusable = version.learnt
        else:
            learnt = [n for _, n in earlier if n is not None]
            reusable = learnt[-1] if learnt else first_cached
        changed = bool(earlier) and (version is None or version.first_done > turn.start)
        return attribute(
            turn,
            None,
            self.events,
            subtree_seen=(reusable, last_ts),
            block_size=self.block_size,
            prefix_changed=changed,
        )

    def _learn(self, turn: Turn, seen: _SubtreeSeen | None) -> None:
        assert turn.subtree is not None
        cached = turn.cached_tokens or 0
        first_cached, versions = (cached, {}) if seen is None else (seen[1], seen[2])
        at = self.events.last_change(turn.subtree, turn.start)
        version = versions.get(at)
        if version is None:
            versions[at] = _Version(first_done=turn.ts)
        elif turn.start >= version.first_done:
            version.learnt = max(version.learnt or 0, cached)
        self._subtree[turn.subtree] = (turn.ts, first_cached, versions)


def _order(rewrite: float | None) -> float:
    return -math.inf if rewrite is None else rewrite


def _before(version: float | None, at: float | None) -> bool:
    """Whether the version started by rewrite ``version`` precedes the one started by ``at``."""
    return _order(version) < _order(at)


def attribute_all(
    turns: Iterable[Turn], events: Events | None = None, block_size: int = DEFAULT_BLOCK_SIZE
) -> list[dict[str, int]]:
    """`Attributor.add` over ``turns`` (sorted here by time, ties kept in order)."""
    attributor = Attributor(events, block_size)
    return [attributor.add(t) for t in sorted(turns, key=lambda t: t.ts)]


def totals(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Sum of per-turn attributions, every cause present (0 when none)."""
    out = dict.fromkeys(CAUSES, 0)
    for part in parts:
        for cause, n in part.items():
            out[cause] += n
    return out


def recomputed_hits(engine_hits: float | None, sidecar_cached: float | None) -> float | None:
    """Tokens the engine counted as prefix hits beyond what the sidecar saw cached over the same
    interval: recomputation after preemption (vLLM counts it as hits). None when either is unknown."""
    if engine_hits is None or sidecar_cached is None:
        return None
    return max(0.0, engine_hits - sidecar_cached)
