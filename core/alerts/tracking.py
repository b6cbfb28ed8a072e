"""The state the rules keep: a rule's verdict (`Condition`), its minimum-duration state machine
(`RuleTracker`), a key's recent signals (`History`), a target's scrape health (`TargetHealth`) and the
events the evaluator returns (`Transition`).

`RuleTracker`: the condition must hold continuously for ``for_s`` before the alert fires, and its *exit*
condition (stricter than "not entered": that is the hysteresis) must hold for ``clear_s`` before it
resolves. One sample never flips an alert either way; an unknown verdict (None) interrupts nothing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from core import risk
from core import signals as sig

Key = tuple[str, str]  # (target URL, engine label)

# The only signals the rules read: histories keep nothing else (memory per target stays small).
RULE_SIGNALS = (
    frozenset(
        {
            sig.TOKEN_WEIGHTED,
            sig.REQUEST_WEIGHTED,
            sig.DIVERGENCE,
            sig.KNOWN_TURNS,
            sig.ENGINE_HIT_RATIO,
            sig.TURNS_PER_S,
            sig.GENERATION_TOKENS_PER_S,
            sig.SESSIONS_IN_SYSTEM,
            sig.REQUESTS_RUNNING,
            sig.REQUESTS_WAITING,
            sig.DEMAND_FRACTION,
            sig.DEMAND_TOKENS,
            sig.POOL_TOKENS,
            sig.BAND_HIGH,
            sig.WAITING,
            sig.OLDEST_WAITING_S,
        }
    )
    | risk.INPUT_SIGNALS
)


@dataclass(frozen=True)
class Condition:
    """A rule's verdict at one instant: holds (True), clear (False) or unknown (None)."""

    active: bool | None
    values: dict[str, float | None] = field(default_factory=dict)
    summary: str = ""
    # When set, the tracker resolves on this (the rule computes its hysteresis itself) instead of `not active`.
    exit_met: bool | None = None


@dataclass(frozen=True)
class Transition:
    rule: str
    key: Key
    event: Literal["firing", "resolved"]
    ts: float
    severity: str
    summary: str
    values: dict[str, float | None]
    # Set on a "resolved" that only means "a cause of this rule is firing on the same target".
    inhibited_by: str | None = None


@dataclass
class RuleTracker:
    """Minimum-duration state machine of one (rule, key)."""

    for_s: float
    clear_s: float
    firing: bool = False
    pending_since: float | None = None
    clearing_since: float | None = None

    def update(self, ts: float, condition: Condition) -> Literal["firing", "resolved"] | None:
        if condition.active is None:
            return None  # unknown: neither fires nor resolves, and interrupts nothing
        if not self.firing:
            self.clearing_since = None
            if condition.active:
                if self.pending_since is None:
                    self.pending_since = ts
                if ts - self.pending_since >= self.for_s:
                    self.firing = True
                    self.pending_since = None
                    return "firing"
            else:
                self.pending_since = None
            return None
        exit_met = condition.exit_met if condition.exit_met is not None else not condition.active
        if exit_met:
            if self.clearing_since is None:
                self.clearing_since = ts
            if ts - self.clearing_since >= self.clear_s:
                self.firing = False
                self.clearing_since = None
                return "resolved"
        else:
            self.clearing_since = None
        return None


class History:
    """Recent (ts, signals) points of one key, oldest first, trimmed to `keep_s`."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self.points: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, ts: float, values: Mapping[str, float | None]) -> None:
        clean = {
            k: float(v) for k, v in values.items() if k in RULE_SIGNALS and v is not None and math.isfinite(v)
        }
        if not clean:
            return
        if self.points and ts <= self.points[-1][0]:
            self.points[-1][1].update(clean)  # same instant (engine + sidecar merged): combine
        else:
            self.points.append((ts, clean))
        while self.points and self.points[0][0] < ts - self.keep_s:
            self.points.popleft()

    def latest(self, name: str) -> float | None:
        for _, values in reversed(self.points):
            if name in values:
                return values[name]
        return None

    def newest(self) -> dict[str, float]:
        """The signals of the newest point (what the last scrape said), empty without any."""
        return self.points[-1][1] if self.points else {}

    def window(self, name: str, start: float, end: float) -> list[tuple[float, float]]:
        return [(t, v[name]) for t, v in self.points if start < t <= end and name in v]


@dataclass
class TargetHealth:
    """What the collector knows about a target's scraping, passed to the evaluator."""

    last_attempt_ts: float | None = None
    last_attempt_ok: bool | None = None
    last_success_ts: float | None = None
    consecutive_failures: int = 0
    failing_since: float | None = None
    last_error: str | None = None
