"""Holding a session's turns: the budgeter's admission answer, the held requests, session ends.

A mixin of `sidecar.control.ControlPlane`, on the event loop thread. A parked or waiting
session's next request awaits an ``asyncio.Future`` registered under its session id (no thread
per held request). ``release()`` and ``unpark`` resolve it:

- ``"forward"``: the budgeter admitted the session and counted this turn in flight;
- ``"retry"``: another held request of the same session was forwarded first; ask
  the budgeter again (it forwards, as the session now has a turn in flight);
- ``"ended"``: the session was ended while the request was held.

At ``--max-sessions`` a new session ends the one idle the longest (reason ``evicted``), or is
refused when none is idle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from core.budgeter import PARKED, UnknownSession

from .control_state import SessionExtra, TurnRefused
from .control_views import Views

log = logging.getLogger(__name__)


class Holding(Views):
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
        idle = [
            s
            for s in self.budgeter.sessions()
            if s.inflight == 0
            and not s.held
            and not (s.state == PARKED and s.manual)
            and s.id not in self._held
        ]
        if not idle:
            raise TurnRefused(
                503,
                "too_many_sessions",
                f"the sidecar tracks its maximum of "
                f"{self.settings.max_sessions} sessions and none is idle; retry later",
            )
        oldest = min(idle, key=lambda s: (s.last_activity, s.id))
        self.end_session(oldest.id, "evicted")
        log.warning(
            "session %r evicted (idle %.0f s): --max-sessions %d reached",
            oldest.id,
            now - oldest.last_activity,
            self.settings.max_sessions,
        )

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
            await asyncio.wait(
                (future, watcher), timeout=self.settings.max_hold_s, return_when=asyncio.FIRST_COMPLETED
            )
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

    def end_session(self, session_id: str, reason: str) -> dict[str, Any] | None:
        now = self.clock()
        try:
            before = self.budgeter.session(session_id)
        except UnknownSession:
            return None
        self.budgeter.end_session(session_id, now)
        self.prompts.forget(session_id)
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
