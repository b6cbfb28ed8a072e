"""The simulated engine stepped in scaled real time inside the event loop (`LiveEngine`).

Simulated time = (wall time since start) x ``speed``. Requests submitted between steps arrive
at the current simulated time; the loop runs the ``Engine`` up to it, wakes the waiters whose
request has something new due (`LiveEngine.wait_change`: its first token, its finish, an abort), and
sleeps until the engine's next event is due or a request arrives. Only those waiters wake: a streamed
answer is otherwise sent every ``STREAM_INTERVAL_S`` wall seconds, whatever came in between in one
chunk. (It had woken every waiter on every step, and each stream sent a chunk per step: at x10 ten
times a real engine's rate.) When the engine has work and comes back to its loop behind its clock,
it steps again at once. When the engine
is behind its clock (its last step ended before the current simulated time: a busy machine, or a
long step), a request that arrives joins it only when the engine's own time reaches the arrival:
added at once, it would be scheduled in a step that began before it arrived, and served sooner
than the cost model allows (3 collapse demos measured 7% more turns/s than their own cost model
gives before this; docs/dashboard.md, "Validation"). A request is
done (`LiveEngine.wait_done`) when it finished and its finish time has come. It also counts the
sessions in the system (an ``X-Session-Id`` seen in the last ``session_idle_s`` simulated seconds).
The HTTP routes in front of it are `simulator.server`.

The process's garbage collector runs between the loop's turns, not wherever an allocation crosses
its threshold (in the middle of a step, or of a request's handling): while the loop runs, automatic
collection is off; after each turn of the loop it collects the young generations once
``GC_YOUNG_OBJECTS`` new tracked objects have accumulated, and everything every ``GC_FULL_EVERY_S``
wall seconds.

Under the recovered collapse demo's load (13 streams at x10 on 2 cores) the engine had sent each
finished answer 35 ms after its finish on average, 73 ms at p90: time a real engine's own e2e counts
and the simulated one's did not. Automatic collection paused it for 3-11 ms three times a second and
for 115-150 ms every 5-7 s; its loop, behind its clock at 96% of its turns, slept 20 ms there; and it
woke every waiter on every step. ``bench/bench_live_engine.py``: 14.0 ms a turn outside the engine's
clock with collection between the loop's turns, 24.5 ms with Python's own (docs/dashboard.md,
"Validation", "Session 11"); 3.5 against 5.5 ms in session 14 (3.0 and 6.0 in single runs before
the two changes below: at the bench's 13 sessions they change nothing it can resolve).

**Read only what has happened** (`LiveEngine.current`). A step is run whole when it begins, so the
engine's statistics count its finishes and tokens up to one step before the clock reaches them (77 ms
of wall time for a collapsed demo's prefill chunk at x10). Its ``/metrics`` are read through
``current``: at the loop's next moment no step runs ahead of the clock, as a real engine's counters
hold only finished work. Read at any moment, a scrape in the collapse (turn latencies rising
0.06 s every second) counted the engine's newest finishes before the sidecar saw them, and the
forecast's ``turn_overhead`` (the turns' latency at the sidecar minus the engine's mean e2e,
interval by interval) came out 0.002 s where the latency outside the engine's clock, joined turn by
turn, was 0.006-0.007 s (docs/dashboard.md, "Validation", "Session 14").

**One wake-up, not three.** A waiter, and the loop's own sleep, await a bare future that the loop
(or a timer) resolves. ``asyncio.wait_for`` on an ``asyncio.Event`` took three of the loop's turns
from the event to the waiter (a task for the wait, its callback, then the waiter), a step of the
engine between each: in the validation's recovery a finished answer left the engine 6-7 ms after its
finish, of the 10-11 ms a turn spent outside the engine's clock (docs/dashboard.md, "Session 14").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from simulator.engine import ABORTED, FINISHED, Engine
from simulator.engine import Request as EngineRequest

log = logging.getLogger(__name__)

STREAM_INTERVAL_S = 0.02  # wall seconds between a streamed answer's chunks, at most (module doc)
GC_YOUNG_OBJECTS = 20_000  # new tracked objects the loop lets accumulate before it collects them
GC_FULL_EVERY_S = 300.0  # wall seconds between full collections
CURRENT_TIMEOUT_S = 1.0  # wall seconds ``current`` waits for the engine to catch up with its clock

T = TypeVar("T")


class LiveEngine:
    """Steps an ``Engine`` in scaled real time inside the event loop."""

    def __init__(
        self, engine: Engine, speed: float, clock: Any = time.monotonic, gc_between_turns: bool = True
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed!r}")
        self.engine = engine
        self.speed = speed
        self.clock = clock
        self.wall0 = clock()
        self.sim0 = engine.now
        self._wakeup: asyncio.Future[None] | None = None  # the loop's sleep (``_kick`` ends it)
        # a waiter: its request, first token seen
        self._watch: dict[asyncio.Future[None], tuple[EngineRequest, bool]] = {}
        self._task: asyncio.Task[None] | None = None
        # False: Python's automatic collection, anywhere in a step (a benchmark's baseline)
        self.gc_between_turns = gc_between_turns
        self._gc_was_enabled = True
        self._gc_full_at = 0.0
        self._pending: collections.deque[EngineRequest] = collections.deque()  # arrived ahead of the engine
        # ``current`` callers: run at the loop's next moment the engine is not ahead of its clock
        self._current: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self.sessions: dict[str, float] = {}  # X-Session-Id -> last seen (sim time)
        self.session_idle_s = 300.0

    def sim_now(self) -> float:
        return self.sim0 + (self.clock() - self.wall0) * self.speed

    def start(self) -> None:
        self._gc_was_enabled = gc.isenabled()
        self._gc_full_at = self.clock()
        if self.gc_between_turns:
            gc.disable()  # collected between the loop's turns (module doc)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            if self._gc_was_enabled:
                gc.enable()

    def _collect_garbage(self) -> None:
        """Between the loop's turns: the young generations past ``GC_YOUNG_OBJECTS``, all of it every
        ``GC_FULL_EVERY_S``."""
        if not self.gc_between_turns:
            return
        if self.clock() - self._gc_full_at >= GC_FULL_EVERY_S:
            gc.collect()
            self._gc_full_at = self.clock()
        elif gc.get_count()[0] >= GC_YOUNG_OBJECTS:
            gc.collect(1)

    def caught_up(self) -> bool:
        """No step of the engine ends after its clock: its statistics hold only what has happened."""
        return self.engine.now <= self.sim_now()

    async def current(self, read: Callable[[], T], timeout: float = CURRENT_TIMEOUT_S) -> T:
        """``read()`` at the loop's next moment the engine is not ahead of its clock (module doc).

        At once when it is not (idle, or behind). A loop that is not running, or that is not caught up
        within ``timeout`` wall seconds, gets ``read()`` as it stands: a scrape is never lost."""
        if self._task is None or self._task.done() or self.caught_up():
            return read()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._current.append((read, future))
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)  # type: ignore[no-any-return]
        except TimeoutError:
            future.cancel()
            return read()

    def _serve_current(self) -> None:
        waiting, self._current = self._current, []
        for read, future in waiting:
            if future.done():
                continue
            try:
                future.set_result(read())
            except Exception as exc:  # noqa: BLE001 - the caller's to handle, not the loop's
                future.set_exception(exc)

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
        self._kick()

    def _kick(self) -> None:
        """End the loop's sleep: something arrived or was aborted."""
        if self._wakeup is not None:
            _release(self._wakeup)

    def _admit_arrived(self) -> None:
        while self._pending and self._pending[0].arrival <= self.engine.now:
            self.engine.add_request(self._pending.popleft())

    def abort(self, req: EngineRequest) -> None:
        if req in self._pending:  # not in the engine yet: it never will be
            self._pending.remove(req)
            self.engine.add_request(req)
        self.engine.abort(req)
        self._kick()  # its waiter wakes at the loop's next turn

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

    def due(self, req: EngineRequest, first_seen: bool) -> bool:
        """Whether ``req`` has news for a waiter: aborted, finished and its finish time come, or (when
        the waiter has not seen it yet) its first token's time come."""
        if req.status == ABORTED:
            return True
        now = self.sim_now()
        if req.status == FINISHED and now >= (req.finish_time or 0.0):
            return True
        return not first_seen and req.first_token_time is not None and now >= req.first_token_time

    async def wait_change(self, req: EngineRequest, first_seen: bool, timeout: float) -> None:
        """Until ``req`` is ``due`` (the loop wakes this waiter alone) or ``timeout`` wall seconds pass."""
        if self.due(req, first_seen):
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watch[woken] = (req, first_seen)
        try:
            await _await_at_most(woken, timeout)
        finally:
            del self._watch[woken]

    def _wake_due(self) -> None:
        for woken, (req, first_seen) in list(self._watch.items()):
            if self.due(req, first_seen):
                _release(woken)

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
            if self._current and self.caught_up():
                self._serve_current()  # before the next step runs ahead of the clock
            try:
                self.advance()
            except Exception:  # noqa: BLE001 - the engine loop must survive a bad request
                log.exception("engine step failed")
            self._wake_due()
            self._collect_garbage()
            ahead = (engine.now - self.sim_now()) / self.speed
            if ahead <= 0 and not (engine.idle() and not self._pending):
                # behind its clock with work to do (the step ended while the loop ran): step again
                # now, after the other tasks had their turn. (It slept 20 ms here: at x10 the
                # recovered collapse demo's short steps left it behind at 96% of the loop's turns,
                # by 12-16 ms on average: docs/dashboard.md, "Validation", "Session 11".)
                await asyncio.sleep(0)
                continue
            delay = min(0.02, ahead) if ahead > 0 else 0.02  # the step's end, or idle: the next arrival
            self._wakeup = asyncio.get_running_loop().create_future()
            try:
                await _await_at_most(self._wakeup, max(delay, 0.001))
            finally:
                self._wakeup = None

    async def wait_done(self, req: EngineRequest) -> bool:
        """Wait until ``req`` finished and its finish time has come; False when it was aborted."""
        while True:
            if req.status == ABORTED:
                return False
            if req.status == FINISHED and self.sim_now() >= (req.finish_time or 0.0):
                return True
            await self.wait_change(req, first_seen=True, timeout=0.25)


async def _await_at_most(future: asyncio.Future[None], timeout: float) -> None:
    """Await ``future`` until it is released, or a timer releases it after ``timeout`` wall seconds: one
    turn of the loop from the release to the awaiting task (module doc, "One wake-up, not three")."""
    timer = asyncio.get_running_loop().call_later(timeout, _release, future)
    try:
        await future
    finally:
        timer.cancel()


def _release(future: asyncio.Future[None]) -> None:
    """Wake whoever awaits ``future`` (a waiter, or the loop's sleep), unless it is already woken."""
    if not future.done():
        future.set_result(None)
