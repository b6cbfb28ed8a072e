"""The sidecar's state: reuse windows, the budgeter, held turns, subtrees, deferrals, audit.

Everything here runs on the event loop thread; decisions are delegated to the pure
core (core.reuse, core.budgeter, core.compaction). The clock is injected.

Per turn, the routes use the public turn API only: ``admit`` (await admission of a session's
turn), ``begin_turn`` (count it in flight) and ``finish_turn`` (record usage, give back its
demand, end the session when asked; idempotent).

Holding: a parked or waiting session's next request awaits an ``asyncio.Future``
registered under its session id (no thread per held request). ``release()`` and
``unpark`` resolve it:

- ``"forward"``: the budgeter admitted the session and counted this turn in flight;
- ``"retry"``: another held request of the same session was forwarded first; ask
  the budgeter again (it forwards, as the session now has a turn in flight);
- ``"ended"``: the session was ended while the request was held.

The regime (thin reuse or not) is advanced by ``tick()`` alone, on the clock; no read does.
Persistence lives in control_state.py, the read documents in control_views.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import sqlite3
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from core.budgeter import PARKED, SESSION_STATES, ConfigError, UnknownSession
from core.compaction import CompactionPolicy, SubtreeTracker, Urgency, WarmthConfig, decide_compaction
from core.reuse import LastTurns, RegimeConfig, RegimeDetector, TimeWindow, normalise_turn

from .control_state import (
    HELD_STATUS,
    UNBOUNDED_TOKENS,
    Counters,
    Deferral,
    Persistence,
    Refused,
    SessionExtra,
    TurnRefused,
    TurnTicket,
)
from .control_views import Views
from .openai_payload import checked_usage
from .settings import Settings
from .store import Store
from .turns import TurnTracing
from .waits import WaitStats

log = logging.getLogger(__name__)

class ControlPlane(Persistence, Views, TurnTracing):
    def __init__(self, settings: Settings, store: Store | None, clock: Callable[[], float] = time.time) -> None:
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
            s.id: s.parked_since for s in self.budgeter.sessions() if s.state == PARKED and s.parked_since is not None}

    # ------------------------------------------------------------ turn API
    def bound_turn(self, ticket: TurnTicket) -> None:
        """No single request's demand above the high band (issue 11 item 3): a prompt larger than the band
        is refused (TurnRefused, 400); an output budget is clamped to the engine's context length and to
        the room left under the band."""
        budget = self.budgeter.config.default_output_budget if ticket.output_budget is None \
            else ticket.output_budget
        if self.context_length is not None and budget > self.context_length - ticket.prompt_estimate:
            ticket.output_budget = budget = max(0, self.context_length - ticket.prompt_estimate)
        pool = self.budgeter.pool_tokens
        if pool is None:
            return
        high = int(self.budgeter.config.high * pool)
        if ticket.prompt_estimate > high:
            raise TurnRefused(400, "request_too_large",
                              f"the prompt (about {ticket.prompt_estimate} tokens) is larger than the high band "
                              f"({high} of the {pool}-token KV pool): it cannot be admitted", field="messages")
        if budget > high - ticket.prompt_estimate:
            ticket.output_budget = high - ticket.prompt_estimate

    async def admit(self, ticket: TurnTicket, disconnected: Callable[[], Awaitable[Any]]) -> str:
        """Admission of a session's turn: ``"forward"`` now or after a hold, else why not (``"ended"``,
        ``"disconnected"``, ``"timeout"``; counted per endpoint)."""
        assert ticket.session_id is not None
        held_at: float | None = None
        parked = False
        while True:
            if self.request_turn(ticket.session_id, ticket.prompt_estimate, ticket.output_budget) == "forward":
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
            budget = self.budgeter.config.default_output_budget if ticket.output_budget is None \
                else ticket.output_budget
            self.budgeter.add_unsessioned(ticket.request_id, ticket.prompt_estimate + budget)
            self.unsessioned_in_flight += 1
            self.counters.unsessioned_requests += 1
        self.in_flight += 1
        ticket.started = time.monotonic()
        if ticket.subtree is not None:
            self.subtrees.begin(ticket.subtree, self.clock())  # the gate defers a subtree being loaded

    def finish_turn(self, ticket: TurnTicket, usage: tuple[int | None, int | None, int | None], ok: bool) -> None:
        """The turn finished (``ok``) or failed; ``usage`` is (prompt, cached, completion). Idempotent."""
        if ticket.finished:
            return
        ticket.finished = True
        self.in_flight -= 1
        if ticket.subtree is not None:
            self.subtrees.end(ticket.subtree)
        prompt, cached, completion, problem = checked_usage(*usage, self.budgeter.pool_tokens or UNBOUNDED_TOKENS)
        if problem is not None:
            self.counters.usage_rejected += 1
            now = self.clock()
            if now - self._usage_warned_at > 60:
                self._usage_warned_at = now
                log.warning("engine usage ignored (%d so far): %s", self.counters.usage_rejected, problem)
        if ok and prompt is None:
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

    # ------------------------------------------------------------ traffic
    def request_turn(self, session_id: str, prompt_tokens: int, output_budget: int | None) -> str:
        self._dirty = True
        now = self.clock()
        if session_id not in self.updated and len(self.updated) >= self.settings.max_sessions:
            self._evict_one(now)
        self.updated[session_id] = now
        parked = self.budgeter.counts()[PARKED]
        decision = self.budgeter.request_turn(session_id, now, prompt_tokens, output_budget)
        if decision == "hold" and self.budgeter.counts()[PARKED] > parked:  # parked at its turn boundary
            self._parked(session_id, now)
        return decision

    def _evict_one(self, now: float) -> None:
        """At --max-sessions: end the session idle the longest (reason ``evicted``), or refuse (503)."""
        idle = [s for s in self.budgeter.sessions() if s.inflight == 0 and not s.held
                and not (s.state == PARKED and s.manual) and s.id not in self._held]
        if not idle:
            raise TurnRefused(503, "too_many_sessions", f"the sidecar tracks its maximum of "
                              f"{self.settings.max_sessions} sessions and none is idle; retry later")
        oldest = min(idle, key=lambda s: (s.last_activity, s.id))
        self.end_session(oldest.id, "evicted")
        log.warning("session %r evicted (idle %.0f s): --max-sessions %d reached", oldest.id,
                    now - oldest.last_activity, self.settings.max_sessions)

    def _parked(self, session_id: str, now: float) -> None:
        if session_id not in self._parked_since:
            self._parked_since[session_id] = now
            self.counters.parks += 1

    def _park_ended(self, session_id: str, now: float, unparked: bool) -> None:
        since = self._parked_since.pop(session_id, None)
        if since is not None:
            self.park_durations.observe(now, now - since)
            if unparked:
                self.counters.unparks += 1

    def touch(self, session_id: str) -> None:
        """The session's document changed: incremental /sessions readers must see it again."""
        self.updated[session_id] = self.clock()

    async def hold(self, session_id: str, disconnected: Callable[[], Awaitable[Any]]) -> str:
        """Wait until the session's held turn is released; -> forward | retry | ended | timeout | disconnected."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._held.setdefault(session_id, []).append(future)
        self.held_requests += 1
        self.counters.held_total += 1
        watcher = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait((future, watcher), timeout=self.settings.max_hold_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            self.held_requests -= 1
        if future.done() and not future.cancelled():
            return future.result()
        future.cancel()
        waiting = self._held.get(session_id)
        if waiting is not None:
            if future in waiting:
                waiting.remove(future)
            if not waiting:
                del self._held[session_id]
                self.budgeter.cancel_held(session_id)
        if watcher.done() and not watcher.cancelled():
            self.counters.hold_disconnects += 1
            return "disconnected"
        self.counters.hold_timeouts += 1
        return "timeout"

    def _wake(self, session_id: str, outcome: str) -> None:
        futures = self._held.pop(session_id, [])
        first = True
        for future in futures:
            if future.done():
                continue
            if outcome == "forward" and not first:
                future.set_result("retry")
            else:
                future.set_result(outcome)
            first = False
        if outcome == "forward" and first:
            # The budgeter counted a held turn in flight but its client is gone: give it back.
            self.budgeter.turn_finished(session_id, self.clock(), 0, 0, None, ok=False)

    def release(self) -> list[str]:
        now = self.clock()
        parked = self.budgeter.counts()[PARKED]
        released = self.budgeter.release(now)
        if parked and self.budgeter.counts()[PARKED] < parked:  # parked sessions were re-admitted
            for session_id in list(self._parked_since):
                if session_id in self.budgeter and self.budgeter.session(session_id).state != PARKED:
                    self._park_ended(session_id, now, unparked=True)
        for session_id in released:
            self.touch(session_id)
            self._wake(session_id, "forward")
        if released:
            self._dirty = True
        return released

    def turn_done(self, session_id: str | None, prompt_tokens: int | None, cached_tokens: int | None,
                  completion_tokens: int | None, latency_s: float, ok: bool, subtree: str | None) -> None:
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
        self.budgeter.turn_finished(session_id, now, prompt or 0, max(0, completion_tokens or 0), latency_s,
                                    ok=ok and prompt is not None)

    def end_session(self, session_id: str, reason: str) -> dict[str, Any] | None:
        now = self.clock()
        try:
            before = self.budgeter.session(session_id)
        except UnknownSession:
            return None
        self.budgeter.end_session(session_id, now)
        self._park_ended(session_id, now, unparked=False)
        self._wake(session_id, "ended")
        extra = self.extras.pop(session_id, None) or SessionExtra()
        record = self._session_doc(before, extra)
        record.update(state="ended", ended_at=now, end_reason=reason, held=0, updated_at=now)
        self.updated.pop(session_id, None)
        self.ended.append(record)
        self.counters.sessions_ended[reason] = self.counters.sessions_ended.get(reason, 0) + 1
        self._dirty = True
        return record

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

    # --------------------------------------------------------- operator
    def audit(self, actor: str, role: str, action: str, params: Any, before: Any, after: Any) -> int:
        if self.store is None:
            return 0
        try:
            return self.store.append_audit(self.clock(), actor, role, action, params, before, after)
        except sqlite3.Error as exc:  # rare: check_writable passed a moment ago
            self.store_failed(exc)
            log.error("audit entry lost: %s by %s %r: %s", action, role, actor, params)
            return 0

    def update_budgeter(self, changes: dict[str, Any], actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.budgeter_settings()
        new = self.budgeter.config.replace(**changes)  # ConfigError first: a bad value is a 422 either way
        self.check_writable()  # Refused (503) when it could not be persisted: nothing changed
        self.budgeter.set_config(new)
        after = self.budgeter_settings()
        self._dirty = True
        self.persist(force=True)
        audit_id = self.audit(actor, role, "budgeter.update", changes, before, after)
        log.info("budgeter settings changed by %r: %s -> %s", actor, before, after)
        self.release()
        return after, audit_id

    def park(self, session_id: str, actor: str, role: str, reason: str | None = None) -> tuple[dict[str, Any], int]:
        before = self.session_doc(session_id)  # UnknownSession propagates
        self.check_writable()
        self.budgeter.park(session_id, self.clock(), manual=True)
        self._parked(session_id, self.clock())
        self.touch(session_id)
        after = self.session_doc(session_id)
        self._dirty = True
        self.persist_session(session_id)
        params: dict[str, Any] = {"session": session_id}
        if reason is not None:
            params["reason"] = reason
        audit_id = self.audit(actor, role, "session.park", params, before, after)
        log.info("session %r parked by %r", session_id, actor)
        self.release()  # its demand left the total: queued sessions may fit now
        return after, audit_id

    def unpark(self, session_id: str, pin: bool, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.session_doc(session_id)
        self.check_writable()
        had_held = self.budgeter.unpark(session_id, self.clock(), pin=pin)
        self._park_ended(session_id, self.clock(), unparked=True)
        self.touch(session_id)
        if had_held:
            self._wake(session_id, "forward")
        after = self.session_doc(session_id)
        self._dirty = True
        self.persist_session(session_id)
        audit_id = self.audit(actor, role, "session.unpark", {"session": session_id, "pin": pin}, before, after)
        log.info("session %r unparked by %r (pin=%s)", session_id, actor, pin)
        return after, audit_id

    def delete_session(self, session_id: str, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.session_doc(session_id)
        self.check_writable()
        record = self.end_session(session_id, "deleted")
        assert record is not None
        self.persist_session(session_id)
        audit_id = self.audit(actor, role, "session.end", {"session": session_id}, before, record)
        return record, audit_id

    def defer_compaction(self, until: float, reason: str, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.compaction_state()
        self.check_writable()
        self.deferral = Deferral(until=until, reason=reason, actor=actor, since=self.clock())
        self._persist_deferral()
        after = self.compaction_state()
        audit_id = self.audit(actor, role, "compaction.defer", {"until": until, "reason": reason}, before, after)
        return after, audit_id

    def allow_compaction(self, actor: str, role: str, reason: str = "") -> tuple[dict[str, Any], int]:
        before = self.compaction_state()
        self.check_writable()
        self.deferral = None
        self._persist_deferral()
        after = self.compaction_state()
        audit_id = self.audit(actor, role, "compaction.allow", {"reason": reason} if reason else {}, before, after)
        return after, audit_id

    def request_compaction(self, targets: list[str], urgency: Urgency, reason: str,
                           request_id: str) -> list[dict[str, Any]]:
        now = self.clock()
        window = self.window.stats(now)
        regime = self.regime.regime  # as the last tick judged it: a request does not advance the regime
        deferred_until = self.deferral.until if self.deferral is not None else None
        stats = self.subtrees.stats(now)
        decisions = decide_compaction(targets, stats, regime=regime, urgency=urgency, now=now,
                                      deferred_until=deferred_until, policy=self.compaction_policy)
        rows: list[dict[str, Any]] = [{
            "ts": now, "request_id": request_id, "subtree_id": d.subtree_id, "decision": d.decision,
            "reason": d.reason, "urgency": urgency, "regime": regime, "request_reason": reason,
            "warm": d.warm, "recent_hits": d.recent_hits, "recent_cached_tokens": d.recent_cached_tokens,
            "token_weighted": window.token_weighted, "divergence": window.divergence,
        } for d in decisions]
        ids = [0] * len(rows)
        if self.store is not None:
            try:
                ids = self.store.append_decisions(rows)
            except sqlite3.Error as exc:  # fail open: the decisions are answered, not recorded
                self.store_failed(exc)
        for row, row_id in zip(rows, ids, strict=True):
            row["id"] = row_id
            key = (row["decision"], urgency)
            self.decision_counts[key] = self.decision_counts.get(key, 0) + 1
        log.info("compaction request %s (%s, %s): %s", request_id, urgency, regime,
                 ", ".join(f"{r['subtree_id']!r}={r['decision']}" for r in rows))
        return rows



__all__ = ["ControlPlane", "SESSION_STATES", "UnknownSession", "ConfigError", "HELD_STATUS", "Refused", "TurnRefused",
           "TurnTicket"]
