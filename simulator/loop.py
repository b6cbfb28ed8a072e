"""The one discrete-event loop of the offline runs (agent and RAG models alike).

Events are ``(when, seq, handler, data)`` on a heap; ``seq`` is the push order,
so events at the same instant run in the order they were pushed. Before each
event the engine runs up to the event's time: if a step finishes requests
first, ``on_finish`` gets each of them (which may push new events) and the
loop looks again at the earliest event. A model pushes its own events
(arrivals, turns, the per-second tick) with the handler to call; nothing here
knows what the events mean.

Nothing reads a clock other than ``time.perf_counter`` for ``wall_s`` (the
simulation's own duration, measured by ``run``).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

from simulator.engine import Engine, Request

Handler = Callable[[float, Any], None]


class EventLoop:
    """A heap of timed events in front of an engine; see the module doc."""

    def __init__(self, engine: Engine, on_finish: Callable[[Request], None]) -> None:
        self.engine = engine
        self.on_finish = on_finish
        self._events: list[tuple[float, int, Handler, Any]] = []
        self._seq = 0

    def push(self, when: float, handler: Handler, data: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, handler, data))

    def every_second(self, n_sec: int, handler: Handler) -> None:
        """A tick at simulated seconds 1..n_sec; ``data`` is the second (int)."""
        for s in range(1, n_sec + 1):
            self.push(float(s), handler, s)

    def run(self) -> float:
        """Run every event; returns the wall seconds it took."""
        events = self._events
        run_until = self.engine.run_until
        on_finish = self.on_finish
        heappop = heapq.heappop
        wall0 = time.perf_counter()
        while events:
            finished = run_until(events[0][0])
            if finished:
                for req in finished:
                    on_finish(req)
                continue
            when, _, handler, data = heappop(events)
            handler(when, data)
        return time.perf_counter() - wall0
