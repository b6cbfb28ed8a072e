"""The simulated engine stepped in scaled real time inside the event loop (`LiveEngine`).

Simulated time = (wall time since start) x ``speed``. Requests submitted between steps arrive
at the current simulated time; the loop runs the ``Engine`` up to it, wakes the requests waiting
on a tick, and sleeps until the engine's next event is due or a request arrives. When the engine
is behind its clock (its last step ended before the current simulated time: a busy machine, or a
long step), a request that arrives joins it only when the engine's own time reaches the arrival:
added at once, it would be scheduled in a step that began before it arrived, and served sooner
than the cost model allows (3 collapse demos measured 7% more turns/s than their own cost model
gives before this; docs/dashboard.md, "Validation"). A request is
done (`LiveEngine.wait_done`) when it finished and its finish time has come. It also counts the
sessions in the system (an ``X-Session-Id`` seen in the last ``session_idle_s`` simulated seconds).
The HTTP routes in front of it are `simulator.server`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import Any

from simulator.engine import ABORTED, FINISHED, Engine
from simulator.engine import Request as EngineRequest

log = logging.getLogger(__name__)


class LiveEngine:
    """Steps an ``Engine`` in scaled real time inside the event loop."""

    def __init__(self, engine: Engine, speed: float, clock: Any = time.monotonic) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed!r}")
        self.engine = engine
        self.speed = speed
        self.clock = clock
        self.wall0 = clock()
        self.sim0 = engine.now
        self._kick = asyncio.Event()
        self._tick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pending: collections.deque[EngineRequest] = collections.deque()  # arrived ahead of the engine
        self.sessions: dict[str, float] = {}  # X-Session-Id -> last seen (sim time)
        self.session_idle_s = 300.0

    def sim_now(self) -> float:
        return self.sim0 + (self.clock() - self.wall0) * self.speed

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, req: EngineRequest) -> None:
        now = self.sim_now()
        self.engine.check_request(req)
        if self.engine.idle() and not self._pending:
            self.engine.now = max(self.engine.now, now)
        req.arrival = max(now, 0.0)
        if self.engine.now >= req.arrival and not self._pending:
            self.engine.add_request(req)
        else:  # the engine is behind its clock: the request joins when the engine reaches its arrival
            self._pending.append(req)
        self._kick.set()

    def _admit_arrived(self) -> None:
        while self._pending and self._pending[0].arrival <= self.engine.now:
            self.engine.add_request(self._pending.popleft())

    def abort(self, req: EngineRequest) -> None:
        if req in self._pending:  # not in the engine yet: it never will be
            self._pending.remove(req)
            self.engine.add_request(req)
        self.engine.abort(req)

    def touch_session(self, session_id: str | None, end: bool) -> None:
        if not session_id:
            return
        if end:
            self.sessions.pop(session_id, None)
        else:
            self.sessions[session_id] = self.sim_now()

    def sessions_in_system(self) -> int:
        horizon = self.sim_now() - self.session_idle_s
        for sid in [s for s, t in self.sessions.items() if t < horizon]:
            del self.sessions[sid]
        return len(self.sessions)

    async def wait_tick(self, timeout: float = 0.25) -> None:
        tick = self._tick
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(tick.wait(), timeout)

    def advance(self) -> None:
        """Run the engine up to the current simulated time, each arrival joining when the engine reaches it."""
        engine = self.engine
        target = self.sim_now()
        for _ in range(1000):
            self._admit_arrived()
            limit = min(target, self._pending[0].arrival) if self._pending else target
            if not engine.run_until(limit) and engine.now >= target:
                break
        self._admit_arrived()

    async def _loop(self) -> None:
        engine = self.engine
        while True:
            try:
                self.advance()
            except Exception:  # noqa: BLE001 - the engine loop must survive a bad request
                log.exception("engine step failed")
            tick, self._tick = self._tick, asyncio.Event()
            tick.set()
            ahead = (engine.now - self.sim_now()) / self.speed
            delay = min(0.02, ahead) if ahead > 0 else 0.02
            self._kick.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), max(delay, 0.001))

    async def wait_done(self, req: EngineRequest) -> bool:
        """Wait until ``req`` finished and its finish time has come; False when it was aborted."""
        while True:
            if req.status == ABORTED:
                return False
            if req.status == FINISHED and self.sim_now() >= (req.finish_time or 0.0):
                return True
            await self.wait_tick()
