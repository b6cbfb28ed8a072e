"""simulator/live_engine.py: an engine behind its clock serves a request no sooner than the cost model allows."""

from __future__ import annotations

import pytest

from simulator.config import CostModel, EngineConfig
from simulator.engine import ABORTED, FINISHED, Engine
from simulator.live_engine import LiveEngine
from tests.simulator.test_engine import content, request

COST = CostModel(
    step_overhead_s=0.01, prefill_per_token_s=1e-3, prefill_attention_s=0.0, decode_per_ctx_token_s=0.0
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_request_arriving_while_the_engine_is_behind_joins_when_the_engine_reaches_it() -> None:
    clock = Clock()
    live = LiveEngine(Engine(EngineConfig(pool_tokens=16 * 4096), COST), speed=10.0, clock=clock)
    # a 5,000-token prefill: 0.01 + 8192-token chunks... one step of 5.01 simulated seconds, from t = 0
    long = request("long", 5000, 2, c=content("long"))
    live.submit(long)
    clock.t = 0.1  # simulated 1.0: the loop runs the first step, which ends at 5.01
    live.advance()
    assert live.engine.now == pytest.approx(5.01) and long.first_scheduled == 0.0
    clock.t = 0.2  # simulated 2.0: the engine is 3 s ahead of its clock; a request now is added at once
    early = request("early", 10, 1, c=content("early"))
    live.submit(early)
    assert early.arrival == 2.0 and early in live.engine.waiting
    # the engine falls behind: its clock runs on to 20.0 while the loop has not stepped
    clock.t = 2.0
    live.advance()  # everything up to 20.0 is done; the engine is idle at 20.0
    clock.t = 2.5  # simulated 25.0: idle, so the engine starts at the request's arrival
    live.submit(late := request("late", 3000, 50, c=content("late")))
    assert late in live.engine.waiting
    live.engine.run_until(25.001)  # one step: 3,000 prefill tokens and the first answer token, to 28.01
    assert live.engine.now == pytest.approx(28.01) and late.status != FINISHED
    clock.t = 3.0  # simulated 30.0, the engine busy at 28.01: behind its clock
    # a request arriving now must not join a step that began at 28.01, before it arrived
    live.submit(behind := request("behind", 10, 1, c=content("behind")))
    assert behind.arrival == 30.0 and behind not in live.engine.waiting
    live.advance()  # "late" finishes at 28.5; the engine, then idle, reaches 30.0 and takes "behind" in
    assert behind in live.engine.waiting and behind.first_scheduled is None
    clock.t = 3.01
    live.advance()
    assert behind.first_scheduled is not None and behind.first_scheduled >= behind.arrival
    assert all(r.status == FINISHED for r in (long, early, behind))
    # the answer carries no time the engine did not spend: one decode step after its arrival
    assert behind.finish_time - behind.arrival < 0.05


def test_a_request_aborted_before_the_engine_reached_it_is_aborted() -> None:
    clock = Clock()
    live = LiveEngine(Engine(EngineConfig(pool_tokens=16 * 4096), COST), speed=10.0, clock=clock)
    live.submit(request("long", 5000, 2, c=content("long")))
    live.engine.run_until(0.001)  # one step, to 5.01
    clock.t = 0.1  # simulated 1.0: the engine is ahead; clock on to 6.0: behind
    clock.t = 0.6
    live.submit(gone := request("gone", 10, 1, c=content("gone")))
    assert gone not in live.engine.waiting
    live.abort(gone)
    assert gone.status == ABORTED
    live.advance()
    assert gone.first_scheduled is None and gone not in live.engine.waiting


def test_a_waiter_wakes_when_its_first_token_and_its_finish_are_due_and_not_for_others() -> None:
    clock = Clock()
    live = LiveEngine(Engine(EngineConfig(pool_tokens=16 * 4096), COST), speed=10.0, clock=clock)
    req = request("r", 100, 3, c=content("r"))
    live.submit(req)
    live.engine.run_until(0.001)  # one step: 100 prefill tokens and the first answer token, to 0.11
    assert req.first_token_time == pytest.approx(0.11) and not live.due(req, first_seen=False)
    clock.t = 0.012  # simulated 0.12: the first token is due, the finish (0.13) not yet
    live.advance()
    assert live.due(req, first_seen=False) and not live.due(req, first_seen=True)
    clock.t = 1.0
    live.advance()
    assert req.status == FINISHED and live.due(req, first_seen=True)


def test_the_loop_wakes_only_the_waiter_whose_request_is_due() -> None:
    import asyncio

    async def scenario() -> tuple[list[str], float]:
        live = LiveEngine(Engine(EngineConfig(pool_tokens=16 * 4096), COST), speed=100.0)
        short, long = request("short", 10, 1, c=content("short")), request("long", 10, 400, c=content("long"))
        woke: list[str] = []

        async def waiter(name: str, req: object) -> None:
            await live.wait_change(req, first_seen=True, timeout=30.0)  # type: ignore[arg-type]
            woke.append(name)

        live.start()
        try:
            for r in (short, long):
                live.submit(r)
            tasks = [asyncio.create_task(waiter(n, r)) for n, r in (("short", short), ("long", long))]
            await tasks[0]
            at = live.sim_now()
            await asyncio.sleep(0.01)  # ~1 simulated second more: "long" has ~4 s of steps left
            still = not tasks[1].done()
            tasks[1].cancel()
            return woke + (["long waiting"] if still else []), at
        finally:
            await live.stop()

    woke, at = asyncio.run(scenario())
    assert woke == ["short", "long waiting"]
    assert at < 1.0  # woken at its finish (0.02 simulated s), not at a 30 s timeout


def test_the_collector_runs_between_the_loops_turns_and_is_restored_after() -> None:
    import asyncio
    import gc

    import simulator.live_engine as le

    async def scenario() -> tuple[bool, int]:
        live = LiveEngine(Engine(EngineConfig(pool_tokens=16 * 4096), COST), speed=100.0)
        live.start()
        try:
            off = not gc.isenabled()
            junk = [[i] for i in range(le.GC_YOUNG_OBJECTS + 100)]  # young tracked objects
            await asyncio.sleep(0.1)  # the idle loop turns every 20 ms and collects them
            young = gc.get_count()[0]
            del junk
            return off, young
        finally:
            await live.stop()

    enabled = gc.isenabled()
    off, young = asyncio.run(scenario())
    assert off and young < le.GC_YOUNG_OBJECTS
    assert gc.isenabled() == enabled


def test_with_automatic_collection_the_loop_leaves_the_collector_alone() -> None:
    import asyncio
    import gc

    async def scenario() -> bool:
        live = LiveEngine(
            Engine(EngineConfig(pool_tokens=16 * 4096), COST), speed=100.0, gc_between_turns=False
        )
        live.start()
        try:
            await asyncio.sleep(0.05)
            return gc.isenabled()
        finally:
            await live.stop()

    assert asyncio.run(scenario()) and gc.isenabled()


def test_a_read_through_current_waits_until_no_step_runs_ahead_of_the_clock() -> None:
    import asyncio

    async def scenario() -> tuple[int, float, float, int, float]:
        live = LiveEngine(Engine(EngineConfig(pool_tokens=16 * 4096), COST), speed=100.0)
        engine = live.engine
        # one prefill step of about 2 simulated s (20 ms wall): it finishes the request
        req = request("one", 2000, 1, c=content("one"))
        live.start()
        try:
            live.submit(req)
            await asyncio.sleep(0.002)  # the loop ran the step: the engine is ahead of its clock
            ahead_finished, ahead_at, step_end = engine.stats.finished, live.sim_now(), engine.now
            finished, at = await live.current(lambda: (engine.stats.finished, live.sim_now()))
            return ahead_finished, ahead_at, step_end, finished, at
        finally:
            await live.stop()

    ahead_finished, ahead_at, step_end, finished, at = asyncio.run(scenario())
    assert ahead_finished == 1 and ahead_at < step_end  # counted before it happened, read directly
    assert finished == 1 and at >= step_end  # read through current: only once it has happened


def test_current_reads_at_once_without_a_running_loop_or_once_its_wait_runs_out() -> None:
    import asyncio

    async def scenario() -> tuple[float, float]:
        clock = Clock()
        live = LiveEngine(Engine(EngineConfig(pool_tokens=16 * 4096), COST), speed=10.0, clock=clock)
        idle = await live.current(lambda: 1.0)  # no loop: read as it stands
        live.submit(request("one", 2000, 1, c=content("one")))
        live.advance()  # ahead of a clock that never moves: never caught up
        live.start()
        try:
            stale = await live.current(lambda: 2.0, timeout=0.05)
        finally:
            await live.stop()
        return idle, stale

    assert asyncio.run(scenario()) == (1.0, 2.0)
