"""Reuse statistics of a prefix cache: R_t, R_r, D over a time window or the last N turns.

Pure code: no I/O, no clock of its own. Callers pass every timestamp in.

Names follow docs/architecture.md:

- ``R_t`` (token-weighted hit rate) = cached prompt tokens / prompt tokens.
- ``R_r`` (request-weighted hit rate) = turns with ``cached_tokens > 0`` / turns.
- ``D`` (divergence) = ``R_r - R_t`` over the same turns.

A turn whose engine reported no ``cached_tokens`` (vLLM without
``--enable-prompt-tokens-details``, SGLang without ``--enable-cache-report``) is
*unknown*: it is counted in ``unknown_turns`` and left out of every rate (it is
not a miss). Rates are ``None`` when no turn with a known cached count exists.

API::

    w = TimeWindow(window_s=60.0)            # or LastTurns(n=200)
    w.add(Turn(t=now, prompt_tokens=1200, cached_tokens=1000))
    s = w.stats(now)                         # ReuseStats (TimeWindow drops turns older than now - window_s)
    d = RegimeDetector(RegimeConfig(enter=0.5, exit=0.4, min_turns=20))  # the defaults
    d.update(s)                              # -> "thin-reuse" | "normal"

``stats_of(turns)`` computes the same ``ReuseStats`` from any iterable of turns.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

# The reuse window's default length (the sidecar's ``--window-s``, the exported PromQL rate windows).
DEFAULT_WINDOW_S = 60.0

Regime = Literal["normal", "thin-reuse"]
REGIMES: tuple[Regime, ...] = ("normal", "thin-reuse")


class ReuseConfigError(ValueError):
    """A reuse window or regime setting is out of range; the message names field and value."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One completed turn as the engine reported it. ``cached_tokens=None`` means unknown."""

    t: float
    prompt_tokens: int
    cached_tokens: int | None

    @property
    def known(self) -> bool:
        return self.cached_tokens is not None

    @property
    def hit(self) -> bool:
        return self.cached_tokens is not None and self.cached_tokens > 0

    @property
    def low_cached(self) -> bool:
        """Under half of the prompt came from the cache (the collapse signature)."""
        return self.cached_tokens is not None and 2 * self.cached_tokens < self.prompt_tokens


@dataclass(frozen=True, slots=True)
class ReuseStats:
    """Aggregates over a set of turns. Rates cover known turns only and are None without any."""

    turns: int
    known_turns: int
    unknown_turns: int
    prompt_tokens: int
    cached_tokens: int
    hit_turns: int
    low_cached_turns: int

    @property
    def token_weighted(self) -> float | None:
        """R_t: cached / prompt tokens over known turns (None when no known prompt tokens)."""
        if self.known_turns == 0:
            return None
        if self.prompt_tokens <= 0:
            return 0.0
        return min(1.0, max(0.0, self.cached_tokens / self.prompt_tokens))

    @property
    def request_weighted(self) -> float | None:
        """R_r: known turns with cached_tokens > 0 / known turns."""
        if self.known_turns == 0:
            return None
        return self.hit_turns / self.known_turns

    @property
    def divergence(self) -> float | None:
        """D = R_r - R_t (None when either is None)."""
        r_t, r_r = self.token_weighted, self.request_weighted
        if r_t is None or r_r is None:
            return None
        return r_r - r_t

    @property
    def low_cached_fraction(self) -> float | None:
        """Fraction of known turns with under half their prompt cached."""
        if self.known_turns == 0:
            return None
        return self.low_cached_turns / self.known_turns

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "token_weighted": self.token_weighted,
            "request_weighted": self.request_weighted,
            "divergence": self.divergence,
            "turns": self.turns,
            "known_turns": self.known_turns,
            "unknown_turns": self.unknown_turns,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_turns": self.hit_turns,
            "low_cached_fraction": self.low_cached_fraction,
        }


EMPTY_STATS = ReuseStats(0, 0, 0, 0, 0, 0, 0)


def validate_turn(turn: Turn) -> Turn:
    """Clamp nothing, reject nonsense: negative counts or cached > prompt are caller bugs."""
    if turn.prompt_tokens < 0:
        raise ReuseConfigError(f"prompt_tokens must be >= 0, got {turn.prompt_tokens}")
    if turn.cached_tokens is not None and turn.cached_tokens < 0:
        raise ReuseConfigError(f"cached_tokens must be >= 0, got {turn.cached_tokens}")
    if not math.isfinite(turn.t):
        raise ReuseConfigError(f"t must be finite, got {turn.t}")
    return turn


def normalise_turn(t: float, prompt_tokens: int, cached_tokens: int | None) -> Turn:
    """A Turn from engine-reported numbers: negatives become 0, cached is capped at prompt."""
    prompt = max(0, int(prompt_tokens))
    cached = None if cached_tokens is None else min(prompt, max(0, int(cached_tokens)))
    return Turn(t=t, prompt_tokens=prompt, cached_tokens=cached)


class _Accumulator:
    """Running sums over a multiset of turns, supporting add and remove in O(1)."""

    __slots__ = ("turns", "known", "prompt", "cached", "hits", "low")

    def __init__(self) -> None:
        self.turns = self.known = self.prompt = self.cached = self.hits = self.low = 0

    def apply(self, turn: Turn, sign: int) -> None:
        self.turns += sign
        if turn.cached_tokens is None:
            return
        self.known += sign
        self.prompt += sign * turn.prompt_tokens
        self.cached += sign * turn.cached_tokens
        self.hits += sign * int(turn.hit)
        self.low += sign * int(turn.low_cached)

    def stats(self) -> ReuseStats:
        return ReuseStats(
            turns=self.turns,
            known_turns=self.known,
            unknown_turns=self.turns - self.known,
            prompt_tokens=self.prompt,
            cached_tokens=self.cached,
            hit_turns=self.hits,
            low_cached_turns=self.low,
        )


def stats_of(turns: Iterable[Turn]) -> ReuseStats:
    """ReuseStats of any collection of turns (the reference the windows must agree with)."""
    acc = _Accumulator()
    for turn in turns:
        acc.apply(turn, +1)
    return acc.stats()


class TimeWindow:
    """Turns completed in the last ``window_s`` seconds: a turn at time t counts while now - t < window_s.

    Turns are expected in non-decreasing time order (a completion clock); an
    out-of-order turn is kept and expires when it reaches the front.
    """

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, max_turns: int = 1_000_000) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ReuseConfigError(f"window_s must be a finite number > 0, got {window_s!r}")
        if max_turns < 1:
            raise ReuseConfigError(f"max_turns must be >= 1, got {max_turns!r}")
        self.window_s = float(window_s)
        self.max_turns = max_turns
        self._turns: deque[Turn] = deque()
        self._acc = _Accumulator()

    def add(self, turn: Turn) -> None:
        self._turns.append(validate_turn(turn))
        self._acc.apply(turn, +1)
        while len(self._turns) > self.max_turns:
            self._acc.apply(self._turns.popleft(), -1)

    def expire(self, now: float) -> None:
        window_s = self.window_s
        turns = self._turns
        while turns and now - turns[0].t >= window_s:
            self._acc.apply(turns.popleft(), -1)

    def stats(self, now: float) -> ReuseStats:
        self.expire(now)
        return self._acc.stats()

    def __len__(self) -> int:
        return len(self._turns)


class LastTurns:
    """The last ``n`` turns, whatever their age."""

    def __init__(self, n: int = 200) -> None:
        if n < 1:
            raise ReuseConfigError(f"n must be >= 1, got {n!r}")
        self.n = n
        self._turns: deque[Turn] = deque()
        self._acc = _Accumulator()

    def add(self, turn: Turn) -> None:
        self._turns.append(validate_turn(turn))
        self._acc.apply(turn, +1)
        if len(self._turns) > self.n:
            self._acc.apply(self._turns.popleft(), -1)

    def stats(self) -> ReuseStats:
        return self._acc.stats()

    def __len__(self) -> int:
        return len(self._turns)


@dataclass(frozen=True, slots=True)
class RegimeConfig:
    """The thin-reuse judgement, the one source of its defaults (the sidecar, the simulator and the
    ``thin-reuse`` alert all derive theirs from it): entered when ``D >= enter`` with at least
    ``min_turns`` known turns in the window, left when ``D < exit`` (judged with as many turns)."""

    enter: float = 0.5
    exit: float = 0.4
    min_turns: int = 20

    def __post_init__(self) -> None:
        for name in ("enter", "exit"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and -1.0 <= value <= 1.0):
                raise ReuseConfigError(f"{name} must be a finite number in [-1, 1], got {value!r}")
        if not self.exit < self.enter:
            raise ReuseConfigError(
                f"exit threshold must be below enter threshold, got exit={self.exit} >= enter={self.enter}"
            )
        if self.min_turns < 1:
            raise ReuseConfigError(f"min_turns must be >= 1, got {self.min_turns!r}")


DEFAULT_REGIME = RegimeConfig()

Verdict = Literal["enter", "hold", "exit"]


def regime_verdict(divergence: float | None, known_turns: int, config: RegimeConfig) -> Verdict | None:
    """What the window says about thin reuse: ``"enter"`` (D >= enter), ``"exit"`` (D < exit), ``"hold"``
    (in between: the regime keeps its state), or None (not judged: no D, or fewer than ``min_turns``
    known turns). The regime detector and the ``thin-reuse`` alert both decide with this function."""
    if divergence is None or known_turns < config.min_turns:
        return None
    if divergence >= config.enter:
        return "enter"
    if divergence < config.exit:
        return "exit"
    return "hold"


def next_regime(current: Regime, stats: ReuseStats, config: RegimeConfig) -> Regime:
    """The regime after seeing ``stats``; unchanged while fewer than ``min_turns`` known turns exist.

    With hysteresis (`regime_verdict`): normal -> thin-reuse when D >= enter; thin-reuse ->
    normal only when D < exit. Between the two thresholds the regime holds.
    """
    verdict = regime_verdict(stats.divergence, stats.known_turns, config)
    if verdict == "enter":
        return "thin-reuse"
    if verdict == "exit":
        return "normal"
    return current


class RegimeDetector:
    """Stateful wrapper around ``next_regime`` that also remembers when the regime last changed."""

    def __init__(self, config: RegimeConfig | None = None, initial: Regime = "normal") -> None:
        self.config = config or RegimeConfig()
        self.regime: Regime = initial
        self.changes = 0
        self.judged = False

    def update(self, stats: ReuseStats) -> Regime:
        self.judged = stats.divergence is not None and stats.known_turns >= self.config.min_turns
        new = next_regime(self.regime, stats, self.config)
        if new != self.regime:
            self.changes += 1
            self.regime = new
        return self.regime
