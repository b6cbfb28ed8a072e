"""The sidecar's state: reuse windows, the budgeter, held turns, subtrees, deferrals, audit.

Everything here runs on the event loop thread; decisions are delegated to the pure
core (core.reuse, core.budgeter, core.compaction). The clock is injected.

Per turn, the routes use the public turn API only: ``admit`` (await admission of a session's
turn), ``begin_turn`` (count it in flight) and ``finish_turn`` (record usage, give back its
demand, end the session when asked; idempotent).

The regime (thin reuse or not) is advanced by ``tick()`` alone, on the clock; no read does.

`ControlPlane` is the turn API, the turn's accounting and the tick; its mixins hold the rest:
holding turns (awaiting the budgeter's admission, releasing, ending sessions) in
control_holding.py, the operator's actions and compaction requests in control_actions.py,
persistence in control_state.py, the read documents in control_views.py and the turn trace in
turns.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from core.budgeter import PARKED, SESSION_STATES, ConfigError, UnknownSession
from core.compaction import CompactionPolicy, SubtreeTracker, WarmthConfig
from core.prompt_estimate import PromptEstimator
from core.reuse import LastTurns, RegimeConfig, RegimeDetector, TimeWindow, normalise_turn

from .control_actions import Operator
from .control_state import (
    HELD_STATUS,
    UNBOUNDED_TOKENS,
    Counters,
    Deferral,
    Refused,
    SessionExtra,
    TurnRefused,
    TurnTicket,
)
from .openai_payload import checked_usage
from .settings import Settings
from .store import Store
from .turns import TurnTracing
from .waits import WaitStats

log = logging.getLogger(__name__)


class ControlPlane(Operator, TurnTracing):
    def __init__(
        self, settings: Settings, store: Store | None, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.started_at = clock()
        self.window = TimeWindow(settings.window_s)
        self.unsessioned_window = TimeWindow(settings.window_s)
        self.last_turns = LastTurns(settings.last_n)
        regime_config = RegimeConfig(settings.regime_enter, settings.regime_exit, settings.regime_min_turns)
        self.regime = RegimeDetector(regime_config)
        self.subtrees = SubtreeTracker(WarmthConfig(settings.warmth_window_s, settings.warmth_floor))
        self.compaction_policy = CompactionPolicy(settings.top_k_pinned)
        self.prompts = PromptEstimator(settings.chars_per_token)
        self.extras: dict[str, SessionExtra] = {}
        self.ended: deque[dict[str, Any]] = deque(maxlen=settings.ended_keep)
        self.deferral: Deferral | None = None
        self.counters = Counters()
        self.decision_counts: dict[tuple[str, str], int] = {}
        self._held: dict[str, list[asyncio.Future[str]]] = {}
        self.updated: dict[str, float] = {}  # session id -> when its document last changed
        self.held_requests = 0
        self.in_flight = 0
        self.unsessioned_in_flight = 0
        self.pool_source: str | None = None
        self.pool_error: str | None = None
        self.engine_kind: str | None = None
        self.engine_error: str | None = None
        self.engine_error_at: float | None = None
        self._dirty = False
        self._last_persist = 0.0
        self._persisted: dict[str, tuple[Any, ...]] = {}
        self._persisted_config: dict[str, Any] | None = None
        self.restored = False
        self.context_length: int | None = None  # the engine's max_model_len, read with the pool size
        self.budgeter = self._restore_budgeter()
        self._restore_deferral()
        if settings.pool_tokens is not None:
            self.budgeter.set_pool(settings.pool_tokens)
            self.cap_demand()
            self.pool_source = "flag"
        if store is not None:
            self.decision_counts = store.decision_counts()
        self._request_ids = itertools.count(1)
        self._init_turns(store, settings.turns_retention_s)
        self.store_error: str | None = None
        self._store_failed_at = -math.inf
        self._usage_warned_at = -math.inf
        self.admission_waits = WaitStats()  # held turns: arrival to forwarding
        self.park_durations = WaitStats()  # park to re-admission, unpark or end
        self._parked_since: dict[str, float] = {
            s.id: s.parked_since
            for s in self.budgeter.sessions()
            if s.state == PARKED and s.parked_since is not None
        }

    # ------------------------------------------------------------ turn API
    def bound_turn(self, ticket: TurnTicket) -> None:
        """No single request's demand above the high band (issue 11 item 3): a prompt larger than the band
        is refused (TurnRefused, 400); an output budget is clamped to the engine's context length and to
        the room left under the band."""
        budget = (
            self.budgeter.config.default_output_budget
            if ticket.output_budget is None
            else ticket.output_budget
        )
        if self.context_length is not None and budget > self.context_length - ticket.prompt_estimate:
            ticket.output_budget = budget = max(0, self.context_length - ticket.prompt_estimate)
        pool = self.budgeter.pool_tokens
        if pool is None:
            return
        high = int(self.budgeter.config.high * pool)
        if ticket.prompt_estimate > high:
            raise TurnRefused(
                400,
                "request_too_large",
                f"the prompt (about {ticket.prompt_estimate} tokens) is larger than the high band "
                f"({high} of the {pool}-token KV pool): it cannot be admitted",
                field="messages",
            )
        if budget > high - ticket.prompt_estimate:
            ticket.output_budget = high - ticket.prompt_estimate

    async def admit(self, ticket: TurnTicket, disconnected: Callable[[], Awaitable[Any]]) -> str:
        """Admission of a session's turn: ``"forward"`` now or after a hold, else why not (``"ended"``,
        ``"disconnected"``, ``"timeout"``; counted per endpoint)."""
        assert ticket.session_id is not None
        held_at: float | None = None
        parked = False
        while True:
            if (
                self.request_turn(ticket.session_id, ticket.prompt_estimate, ticket.output_budget)
                == "forward"
            ):
                break
            if held_at is None:
                held_at = self.clock()
            parked = parked or ticket.session_id in self._parked_since
            outcome = await self.hold(ticket.session_id, disconnected)
            if outcome == "retry":
                continue
            if outcome != "forward":
                self.counters.request(ticket.path, f"held_{HELD_STATUS[outcome]}")
                ticket.held_s = self.clock() - held_at
                ticket.parked_s = ticket.held_s if parked else 0.0
                self.trace_turn(ticket, None, None, None, None, f"held_{HELD_STATUS[outcome]}")
                return outcome
            break
        if held_at is not None:
            now = self.clock()
            self.admission_waits.observe(now, now - held_at)
            ticket.held_s = now - held_at
            ticket.parked_s = ticket.held_s if parked else 0.0
        return "forward"

    def begin_turn(self, ticket: TurnTicket) -> None:
        """The turn goes to the engine now: count it in flight (an unsessioned one adds its demand)."""
        if ticket.session_id is None:
            ticket.request_id = f"u{next(self._request_ids)}"
            budget = (
                self.budgeter.config.default_output_budget
                if ticket.output_budget is None
                else ticket.output_budget
            )
            self.budgeter.add_unsessioned(ticket.request_id, ticket.prompt_estimate + budget)
            self.unsessioned_in_flight += 1
            self.counters.unsessioned_requests += 1
        self.in_flight += 1
        ticket.started = time.monotonic()
        if ticket.subtree is not None:
            self.subtrees.begin(ticket.subtree, self.clock())  # the gate defers a subtree being loaded

    def finish_turn(
        self, ticket: TurnTicket, usage: tuple[int | None, int | None, int | None], ok: bool
    ) -> None:
        """The turn finished (``ok``) or failed; ``usage`` is (prompt, cached, completion). Idempotent."""
        if ticket.finished:
            return
        ticket.finished = True
        self.in_flight -= 1
        if ticket.subtree is not None:
            self.subtrees.end(ticket.subtree)
        prompt, cached, completion, problem = checked_usage(
            *usage, self.budgeter.pool_tokens or UNBOUNDED_TOKENS
        )
        if problem is not None:
            self.counters.usage_rejected += 1
            now = self.clock()
            if now - self._usage_warned_at > 60:
                self._usage_warned_at = now
                log.warning("engine usage ignored (%d so far): %s", self.counters.usage_rejected, problem)
        if ok and prompt is not None:  # the engine's count teaches the estimate of the next prompts
            self.prompts.observe(ticket.session_id, ticket.prompt_chars, ticket.prompt_ids, prompt)
        elif ok:
            # A success without usage (an engine that reports none): the turn counts, its cache use is
            # unknown, and the prompt size is the estimate.
            prompt, cached, completion = ticket.prompt_estimate, None, completion or 0
        latency = time.monotonic() - ticket.started
        self.turn_done(ticket.session_id, prompt, cached, completion, latency, ok, ticket.subtree)
        self.trace_turn(ticket, prompt, cached, completion, latency, "ok" if ok else "error")
        self.counters.model_turn(ticket.model, prompt, cached, completion, latency, ok)
        if ticket.session_id is None:
            self.budgeter.remove_unsessioned(ticket.request_id)
            self.unsessioned_in_flight -= 1
        elif ticket.end_session:
            self.end_session(ticket.session_id, "client")
        self.release()
        self.counters.request(ticket.path, "ok" if ok else "error")

    def turn_done(
        self,
        session_id: str | None,
        prompt_tokens: int | None,
        cached_tokens: int | None,
        completion_tokens: int | None,
        latency_s: float,
        ok: bool,
        subtree: str | None,
    ) -> None:
        now = self.clock()
        prompt = prompt_tokens if prompt_tokens is not None and prompt_tokens >= 0 else None
        if ok and prompt is not None:
            turn = normalise_turn(now, prompt, cached_tokens)
            self.window.add(turn)
            self.last_turns.add(turn)
            if session_id is None:
                self.unsessioned_window.add(turn)
            self.counters.turns += 1
            self.counters.prompt_tokens += turn.prompt_tokens
            self.counters.completion_tokens += max(0, completion_tokens or 0)
            if turn.cached_tokens is None:
                self.counters.unknown_turns += 1
            else:
                self.counters.cached_tokens += turn.cached_tokens
                self.counters.known_turns += 1
                self.counters.known_prompt_tokens += turn.prompt_tokens
                self.counters.known_cached_tokens += turn.cached_tokens
                if turn.cached_tokens > 0:
                    self.counters.hit_turns += 1
            if subtree is not None:
                self.subtrees.record(subtree, now, turn.prompt_tokens, turn.cached_tokens)
        if session_id is None:
            return
        self._dirty = True
        self.updated[session_id] = now
        extra = self.extras.setdefault(session_id, SessionExtra())
        extra.requests += 1
        if subtree is not None:
            extra.subtree = subtree
        if ok and prompt is not None:
            extra.prompt_tokens += prompt
            extra.last_prompt_tokens = prompt
            extra.last_completion_tokens = max(0, completion_tokens or 0)
            if cached_tokens is not None:
                extra.cached_tokens += min(prompt, max(0, cached_tokens))
                extra.last_cached_fraction = (min(prompt, max(0, cached_tokens)) / prompt) if prompt else None
        else:
            extra.failed_turns += 1
        self.budgeter.turn_finished(
            session_id,
            now,
            prompt or 0,
            max(0, completion_tokens or 0),
            latency_s,
            ok=ok and prompt is not None,
        )

    # ------------------------------------------------------------ periodic
    def tick(self) -> None:
        now = self.clock()
        for session_id in self.budgeter.idle_sessions(now, self.settings.idle_timeout_s):
            if session_id in self._held:
                continue
            self.end_session(session_id, "idle")
            log.info("session %r ended after %.0f s idle", session_id, self.settings.idle_timeout_s)
        self.regime.update(self.window.stats(now))
        self.release()
        if self.deferral is not None and now >= self.deferral.until:
            log.info("compaction deferral by %r ended", self.deferral.actor)
            self.deferral = None
            self._persist_deferral()
        self.persist()
        self.flush_turns()


__all__ = [
    "ControlPlane",
    "SESSION_STATES",
    "UnknownSession",
    "ConfigError",
    "HELD_STATUS",
    "Refused",
    "TurnRefused",
    "TurnTicket",
]
