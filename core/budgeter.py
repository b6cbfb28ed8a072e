"""The KV budgeter: which agent sessions may run, counted in KV tokens.

One implementation, run by the sidecar (with a wall clock and HTTP around it),
by the offline simulator (with a simulated clock) and by the dashboard's
preview (on a copy). It is pure: every call takes ``now`` and nothing here
reads a clock, does I/O or keeps global state.

Vocabulary (docs/architecture.md):

* A session is *admitted* (its turns go to the engine), *parked* (its next turn
  is held at the sidecar; its cached prefix may be evicted) or *waiting* (a new
  session not yet admitted).
* *Demand* is the sum over admitted sessions of
  ``max(last turn's prompt + completion, prompt in flight) + output budget``
  (a failed turn's output budget leaves demand once nothing of the session is in flight),
  plus the prompts of unsessioned requests while they are in flight.
* A *turn boundary* is the arrival of a session's next request after its
  previous one completed. Sessions are parked only there: a request that
  arrives while the same session has one in flight belongs to the current
  turn and is always forwarded.

Controls (``BudgeterConfig.mode``), the same names everywhere in the project:

``off``
    Admit everything, never park.
``admission-only``
    Admit new sessions while demand < low band; never park anyone.
``latency-park``
    Park at turn boundaries while the mean latency of recent turns exceeds
    ``latency_limit_s``; admit again, one session per finished turn, once it
    is back under the limit.
``session-cap-park``
    At most ``session_cap`` admitted sessions; park beyond it.
``budgeter-park`` (default)
    Admit while demand < low band; above the high band park at turn
    boundaries; re-admit parked sessions once demand < low band.

Who is parked, and why nobody starves: when parking is needed, the *park set*
is the most recently admitted sessions (by first admission, pinned ones
excluded), taken newest first until what is left fits under the band; a
session is parked when it reaches a turn boundary while it is in the park set.
Parking the newest protects the oldest sessions' warm prefixes, so they finish
and leave (as vLLM preempts its newest request). Re-admission is strictly
FIFO: parked sessions by park time first, then waiting sessions by arrival;
the head of the queue blocks those behind it, and a re-admitted session keeps
its original admission time, so it is not the first to be parked again.
When nothing at all is admitted, the head of the queue is admitted whatever
its size, so one session larger than the band cannot block forever.

Operator overrides: a manual park holds the session until a manual unpark;
a manual unpark admits at once, even above the band, and with ``pin`` the
session is exempt from automatic parking until it ends.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

from core.budgeter_config import (
    ADMITTED,
    CONTROLS,
    PARKED,
    SESSION_STATES,
    WAITING,
    BudgeterConfig,
    ConfigError,
    Decision,
    UnknownSession,
)
from core.projection import projected_demand

__all__ = [
    "ADMITTED",
    "CONTROLS",
    "PARKED",
    "SESSION_STATES",
    "WAITING",
    "Budgeter",
    "BudgeterConfig",
    "ConfigError",
    "Decision",
    "Preview",
    "SessionState",
    "UnknownSession",
]


@dataclass
class SessionState:
    """What the budgeter knows of one session. Copies are handed out; mutate only through Budgeter."""

    id: str
    state: str
    arrived_at: float
    admitted_at: float | None = None
    context_tokens: int = 0
    inflight_prompt: int = 0
    output_budget: int = 0
    turns: int = 0
    inflight: int = 0
    held: bool = False
    manual: bool = False
    pinned: bool = False
    parked_since: float | None = None
    last_activity: float = 0.0
    last_latency_s: float | None = None

    @property
    def demand_tokens(self) -> int:
        return max(self.context_tokens, self.inflight_prompt) + self.output_budget


@dataclass(frozen=True)
class Preview:
    """What a configuration would do right now (for the dashboard's Budgeter page)."""

    would_park: list[str]
    would_admit: list[str]
    demand_tokens: int
    pool_tokens: int | None


@dataclass
class Budgeter:
    """Admission and parking state for the sessions in front of one engine."""

    config: BudgeterConfig = field(default_factory=BudgeterConfig)
    pool_tokens: int | None = None
    _sessions: dict[str, SessionState] = field(default_factory=dict, repr=False)
    _unsessioned: dict[str, int] = field(default_factory=dict, repr=False)
    _latencies: deque[float] = field(default_factory=deque, repr=False)
    _turns_since_admit: int = field(default=0, repr=False)
    # Kept up to date by _edit(), so a turn costs O(1) until parking is actually needed.
    _admitted_demand: int = field(default=0, repr=False)
    _counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SESSION_STATES, 0), repr=False)
    _ended: list[int] = field(default_factory=lambda: [0, 0], repr=False)  # sessions ended, their turns

    # ----------------------------------------------------------------- settings
    def set_config(self, config: BudgeterConfig) -> None:
        self.config = config

    def set_pool(self, pool_tokens: int | None) -> None:
        if pool_tokens is not None and pool_tokens <= 0:
            raise ConfigError(f"pool_tokens must be positive, got {pool_tokens!r}", "pool_tokens")
        self.pool_tokens = pool_tokens

    # ------------------------------------------------------------------ queries
    def demand_tokens(self) -> int:
        return self._admitted_demand + sum(self._unsessioned.values())

    def projected_demand_tokens(self, now: float, horizon_s: float, turns_per_s: float) -> int:
        """Demand expected ``horizon_s`` from ``now`` at ``turns_per_s`` (`core.projection`; unsessioned stay)."""
        mean_turns = self._ended[1] / self._ended[0] if self._ended[0] else None
        admitted = [s for s in self._sessions.values() if s.state == ADMITTED]
        arrivals = [s.arrived_at for s in self._sessions.values()]
        projected = projected_demand(admitted, arrivals, mean_turns, turns_per_s, now, horizon_s)
        return round(projected) + sum(self._unsessioned.values())

    def sessions(self) -> list[SessionState]:
        return [copy.copy(s) for s in self._sessions.values()]

    def session(self, session_id: str) -> SessionState:
        try:
            return copy.copy(self._sessions[session_id])
        except KeyError:
            raise UnknownSession(session_id) from None

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def held_sessions(self) -> list[str]:
        return [s.id for s in self._sessions.values() if s.held]

    def recent_latency_s(self) -> float | None:
        return sum(self._latencies) / len(self._latencies) if self._latencies else None

    def band_tokens(self) -> tuple[float, float] | None:
        if self.pool_tokens is None:
            return None
        return self.config.low * self.pool_tokens, self.config.high * self.pool_tokens

    def park_set(self) -> list[str]:
        """Admitted sessions that would be parked at their next turn boundary, newest first."""
        mode = self.config.mode
        if not self._parking_needed():
            return []
        candidates = sorted(
            (s for s in self._sessions.values() if s.state == ADMITTED and not s.pinned),
            key=lambda s: (s.admitted_at or 0.0, s.id),
            reverse=True,
        )
        if mode == "budgeter-park":
            bands = self.band_tokens()
            if bands is None:
                return []
            demand = self.demand_tokens()
            chosen = []
            for s in candidates:
                if demand <= bands[1]:
                    break
                chosen.append(s.id)
                demand -= s.demand_tokens
            return chosen
        if mode == "session-cap-park":
            excess = self.counts()[ADMITTED] - self.config.session_cap
            return [s.id for s in candidates[: max(0, excess)]]
        if mode == "latency-park":
            latency = self.recent_latency_s()
            if latency is None or latency <= self.config.latency_limit_s:
                return []
            return [s.id for s in candidates[: max(1, math.ceil(len(candidates) / 4))]]
        return []

    def _parking_needed(self) -> bool:
        mode = self.config.mode
        if mode == "budgeter-park":
            bands = self.band_tokens()
            return bands is not None and self.demand_tokens() > bands[1]
        if mode == "session-cap-park":
            return self._counts[ADMITTED] > self.config.session_cap
        if mode == "latency-park":
            latency = self.recent_latency_s()
            return latency is not None and latency > self.config.latency_limit_s
        return False

    # ------------------------------------------------------------------- events
    def request_turn(
        self, session_id: str, now: float, prompt_tokens: int, output_budget: int | None = None
    ) -> Decision:
        """A request of ``session_id`` arrived: forward it to the engine now, or hold it."""
        budget = self.config.default_output_budget if output_budget is None else max(0, output_budget)
        prompt_tokens = max(0, prompt_tokens)
        s = self._sessions.get(session_id)
        if s is None:
            s = SessionState(
                id=session_id,
                state=WAITING,
                arrived_at=now,
                inflight_prompt=prompt_tokens,
                output_budget=budget,
                last_activity=now,
            )
            queue_empty = not self._queue()
            admit = self.config.mode == "off" or (queue_empty and self._may_admit(s))
            self._sessions[session_id] = s
            self._counts[WAITING] += 1
            with self._edit(s):
                if admit:
                    self._admit(s, now)
                    s.inflight += 1
                else:
                    s.held = True
            return "forward" if admit else "hold"
        s.last_activity = now
        with self._edit(s):
            if s.inflight > 0:
                s.inflight += 1
                s.inflight_prompt = max(s.inflight_prompt, prompt_tokens)
                return "forward"
            s.inflight_prompt = prompt_tokens
            s.output_budget = budget
        if s.state != ADMITTED:
            s.held = True
            return "hold"
        if self._parking_needed() and session_id in self.park_set():
            with self._edit(s):
                s.state = PARKED
                s.parked_since = now
                s.held = True
            return "hold"
        s.inflight += 1
        return "forward"

    def turn_finished(
        self,
        session_id: str,
        now: float,
        prompt_tokens: int,
        completion_tokens: int,
        latency_s: float | None = None,
        ok: bool = True,
    ) -> None:
        """A forwarded request of ``session_id`` completed (``ok``) or failed."""
        s = self._sessions.get(session_id)
        if s is None or s.inflight == 0:
            return  # nothing of this session was forwarded (e.g. before a restart)
        s.inflight -= 1
        s.last_activity = now
        with self._edit(s):
            if ok:
                s.context_tokens = max(0, prompt_tokens) + max(0, completion_tokens)
            if s.inflight == 0:
                s.inflight_prompt = 0
                if not ok:
                    s.output_budget = 0  # a failed turn's output budget leaves demand
        if ok:
            s.turns += 1
            if latency_s is not None and math.isfinite(latency_s) and latency_s >= 0:
                s.last_latency_s = latency_s
                self._latencies.append(latency_s)
                while len(self._latencies) > self.config.latency_window:
                    self._latencies.popleft()
                self._turns_since_admit += 1

    def end_session(self, session_id: str, now: float) -> SessionState | None:
        """The session ended (explicitly or idle); it no longer counts anywhere."""
        s = self._sessions.pop(session_id, None)
        if s is not None:
            self._counts[s.state] -= 1
            if s.turns:
                self._ended[0] += 1
                self._ended[1] += s.turns
            if s.state == ADMITTED:
                self._admitted_demand -= s.demand_tokens
        return s

    def release(self, now: float) -> list[str]:
        """Admit queued sessions that fit now, FIFO; returns those whose held turn must be forwarded."""
        forwarded: list[str] = []
        if self._counts[PARKED] + self._counts[WAITING] == 0:
            return forwarded
        for s in self._queue():
            if not self._may_admit(s):
                break
            with self._edit(s):
                self._admit(s, now)
            if s.held:
                s.held = False
                s.inflight += 1
                forwarded.append(s.id)
        return forwarded

    def park(self, session_id: str, now: float, manual: bool = True) -> None:
        """Park a session: its next turn is held (one in flight finishes)."""
        s = self._get(session_id)
        with self._edit(s):
            if s.state != PARKED:
                s.parked_since = now
            s.state = PARKED
            s.manual = s.manual or manual
            s.pinned = False

    def unpark(self, session_id: str, now: float, pin: bool = False) -> bool:
        """Admit a session at once, even above the band. True when it had a turn held to forward."""
        s = self._get(session_id)
        s.manual = False
        s.pinned = s.pinned or pin
        if s.state == ADMITTED:
            return False
        with self._edit(s):
            self._admit(s, now)
        if s.held:
            s.held = False
            s.inflight += 1
            return True
        return False

    def cancel_held(self, session_id: str) -> None:
        """A held client went away: the session keeps its state and its place in the queue."""
        s = self._sessions.get(session_id)
        if s is not None:
            s.held = False

    def cap_demand(self, limit: int) -> list[str]:
        """Lower output budgets so no session's demand exceeds ``limit`` tokens where its budget allows
        (a budget restored from before a limit existed, say); returns the ids changed. Totals stay exact."""
        changed = []
        for s in self._sessions.values():
            if s.demand_tokens > limit and s.output_budget > 0:
                with self._edit(s):
                    s.output_budget = max(0, limit - max(s.context_tokens, s.inflight_prompt))
                changed.append(s.id)
        return changed

    def add_unsessioned(self, request_id: str, tokens: int) -> None:
        self._unsessioned[request_id] = max(0, tokens)

    def remove_unsessioned(self, request_id: str) -> None:
        self._unsessioned.pop(request_id, None)

    def idle_sessions(self, now: float, timeout_s: float) -> list[str]:
        """Sessions with nothing in flight or held for ``timeout_s``; manual parks never expire."""
        return [
            s.id
            for s in self._sessions.values()
            if s.inflight == 0
            and not s.held
            and not (s.state == PARKED and s.manual)
            and now - s.last_activity >= timeout_s
        ]

    def preview(self, config: BudgeterConfig, now: float) -> Preview:
        """Which sessions ``config`` would park at their next boundary and admit now, on a copy."""
        trial = copy.deepcopy(self)
        trial.set_config(config)
        would_admit = [s.id for s in trial._queue()]
        trial.release(now)
        would_admit = [sid for sid in would_admit if trial._sessions[sid].state == ADMITTED]
        return Preview(
            would_park=trial.park_set(),
            would_admit=would_admit,
            demand_tokens=trial.demand_tokens(),
            pool_tokens=trial.pool_tokens,
        )

    # -------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        """Everything that must survive a restart (held requests do not: their clients are gone)."""
        return {
            "config": self.config.to_dict(),
            "pool_tokens": self.pool_tokens,
            "sessions": [dict(vars(s)) for s in self._sessions.values()],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budgeter:
        budgeter = cls(BudgeterConfig(**data.get("config", {})), data.get("pool_tokens"))
        known = {f.name for f in fields(SessionState)}
        for raw in data.get("sessions", []):
            s = SessionState(**{k: v for k, v in raw.items() if k in known})
            s.inflight = 0
            s.inflight_prompt = 0
            s.held = False
            budgeter._sessions[s.id] = s
            budgeter._counts[s.state] += 1
            if s.state == ADMITTED:
                budgeter._admitted_demand += s.demand_tokens
        return budgeter

    # ---------------------------------------------------------------- internals
    @contextmanager
    def _edit(self, s: SessionState) -> Iterator[None]:
        """Every change to a session's state or demand goes through here, keeping the totals exact."""
        state, demand = s.state, s.demand_tokens
        try:
            yield
        finally:
            if state != s.state:
                self._counts[state] -= 1
                self._counts[s.state] += 1
            if state == ADMITTED:
                self._admitted_demand -= demand
            if s.state == ADMITTED:
                self._admitted_demand += s.demand_tokens

    def _get(self, session_id: str) -> SessionState:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSession(session_id) from None

    def _queue(self) -> list[SessionState]:
        parked = sorted(
            (s for s in self._sessions.values() if s.state == PARKED and not s.manual),
            key=lambda s: (s.parked_since or 0.0, s.id),
        )
        waiting = sorted(
            (s for s in self._sessions.values() if s.state == WAITING), key=lambda s: (s.arrived_at, s.id)
        )
        return parked + waiting

    def _admit(self, s: SessionState, now: float) -> None:
        s.state = ADMITTED
        s.parked_since = None
        if s.admitted_at is None:
            s.admitted_at = now
        self._turns_since_admit = 0

    def _may_admit(self, s: SessionState) -> bool:
        mode = self.config.mode
        if mode == "off":
            return True
        counts = self.counts()
        if counts[ADMITTED] == 0 and not self._unsessioned:
            return True
        if mode in ("admission-only", "budgeter-park"):
            bands = self.band_tokens()
            return bands is None or self.demand_tokens() < bands[0]
        if mode == "session-cap-park":
            return counts[ADMITTED] < self.config.session_cap
        if mode == "latency-park":
            latency = self.recent_latency_s()
            return latency is None or (latency <= self.config.latency_limit_s and self._turns_since_admit > 0)
        raise AssertionError(f"unhandled mode {mode!r}")
