"""Budgeter-driven holding: waiting, parking at turn boundaries, FIFO release, max-hold, manual park/unpark."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.control import ControlPlane
from sidecar.settings import Settings
from tests.stubs.stub_engine import StubEngine

from .conftest import OP_HEADERS, FakeClock, Harness, settle, sidecar

pytestmark = pytest.mark.anyio


class Results:
    def __init__(self) -> None:
        self.done: list[tuple[str, int]] = []

    def spawn(self, tg: anyio.abc.TaskGroup, h: Harness, session: str, **kw: Any) -> None:
        async def run() -> None:
            r = await h.chat(session, **kw)
            self.done.append((session, r.status_code))

        tg.start_soon(run)


def held(h: Harness) -> int:
    return h.cp.held_requests


async def test_new_session_waits_above_the_low_band_and_is_admitted_when_demand_falls(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=1000) as h:
        assert (await h.chat("s1", max_tokens=800)).status_code == 200  # demand ~817 > low band 750
        results = Results()
        async with anyio.create_task_group() as tg:
            results.spawn(tg, h, "s2", max_tokens=10)
            await settle(lambda: held(h) == 1, "s2 held")
            backlog = (await h.state())["backlog"]
            counts = {k: backlog[k] for k in ("admitted", "parked", "waiting", "total", "held_requests")}
            assert counts == {"admitted": 1, "parked": 0, "waiting": 1, "total": 2, "held_requests": 1}
            assert backlog["oldest_waiting_s"] == 0.0 and backlog["oldest_parked_s"] is None
            assert results.done == []
            h.cp.release()  # nothing changed: still above the band
            await anyio.sleep(0.02)
            assert results.done == []
            assert (await h.client.delete("/sessions/s1", headers=OP_HEADERS)).status_code == 200
        assert results.done == [("s2", 200)]
        assert (await h.client.get("/sessions/s2")).json()["state"] == "admitted"


async def test_parked_at_the_next_turn_boundary_never_mid_turn(tmp_path: Path) -> None:
    # a request wrongly held mid-turn gets its 503 after 30 s, not after the default 600
    async with sidecar(tmp_path, pool_tokens=1000, max_hold_s=30.0) as h:
        await h.chat("s1", max_tokens=100)
        results = Results()
        async with anyio.create_task_group() as tg:
            # the engine holds this answer until the test lets it go: s1 stays mid-turn however slow the machine
            results.spawn(tg, h, "s1", max_tokens=100, headers={"x-stub-wait-for": "s1 turn"})
            await settle(lambda: h.cp.in_flight == 1, "s1 in flight")
            # the operator lowers the bands: s1 is far above the high band now
            r = await h.client.put("/control/budgeter", headers=OP_HEADERS, json={"low": 0.01, "high": 0.02})
            assert r.status_code == 200
            assert h.cp.budgeter.park_set() == ["s1"]
            # a request of the same session while one is in flight belongs to the turn: forwarded
            second = await h.chat("s1", max_tokens=100)
            assert second.status_code == 200
            assert h.cp.in_flight == 1 and results.done == []  # the first request was still in flight
            h.engine.gate("s1 turn").set()
        assert results.done == [("s1", 200)]
        async with anyio.create_task_group() as tg:
            results.spawn(tg, h, "s1", max_tokens=100)  # the next turn boundary: parked
            await settle(lambda: held(h) == 1, "s1 held at its turn boundary")
            s1 = (await h.client.get("/sessions/s1")).json()
            assert s1["state"] == "parked" and not s1["manual"] and s1["held"] == 1
            assert s1["pending_prompt_tokens"] > 0  # the held turn's prompt, as the sidecar estimates it
            assert s1["parked_since"] == h.clock()
            await h.client.put("/control/budgeter", headers=OP_HEADERS, json={"low": 0.75, "high": 0.95})
        assert results.done[-1] == ("s1", 200)


async def test_parked_sessions_are_released_fifo_before_new_sessions(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=1000) as h:
        for sid, budget in (("s1", 300), ("s2", 300), ("s3", 400)):
            assert (await h.chat(sid, max_tokens=budget)).status_code == 200
        assert h.cp.budgeter.demand_tokens() > 950
        results = Results()
        async with anyio.create_task_group() as tg:
            results.spawn(tg, h, "s3", max_tokens=400)  # newest admitted: parked at its boundary
            await settle(lambda: held(h) == 1, "s3 parked")
            h.clock.advance(1)
            results.spawn(tg, h, "s4", max_tokens=10)  # new: waits behind the parked session
            await settle(lambda: held(h) == 2, "s4 waiting")
            assert (await h.state())["backlog"]["parked"] == 1 and (await h.state())["backlog"][
                "waiting"
            ] == 1
            h.cp.release()  # demand without s3 is under the low band: s3 first, and s4 no longer fits
            await settle(lambda: len(results.done) == 1, "s3 forwarded")
            assert results.done == [("s3", 200)]
            await anyio.sleep(0.02)
            assert held(h) == 1
            await h.client.delete("/sessions/s1", headers=OP_HEADERS)
            await h.client.delete("/sessions/s2", headers=OP_HEADERS)
        assert results.done == [("s3", 200), ("s4", 200)]


async def test_held_longer_than_max_hold_gets_503_and_stays_parked(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=100_000, max_hold_s=0.2) as h:
        await h.chat("s1")
        await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS)
        r = await h.chat("s1")
        assert r.status_code == 503
        assert int(r.headers["Retry-After"]) >= 1
        err = r.json()["error"]
        assert err["type"] == "session_parked" and "parked" in err["message"] and err["session"] == "s1"
        s1 = (await h.client.get("/sessions/s1")).json()
        assert s1["state"] == "parked" and s1["manual"] and s1["held"] == 0
        assert h.cp.counters.hold_timeouts == 1


async def test_manual_park_holds_until_manual_unpark_even_with_room(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=100_000) as h:
        await h.chat("s1")
        await h.client.put("/control/budgeter", headers=OP_HEADERS, json={"mode": "off"})
        await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS)
        results = Results()
        async with anyio.create_task_group() as tg:
            results.spawn(tg, h, "s1")
            await settle(lambda: held(h) == 1, "s1 held")
            h.cp.release()
            h.cp.tick()
            await anyio.sleep(0.02)
            assert results.done == []
            r = await h.client.post("/control/sessions/s1/unpark", headers=OP_HEADERS)  # no body at all
            assert r.status_code == 200 and r.json()["session"]["state"] == "admitted"
        assert results.done == [("s1", 200)]


async def test_manual_unpark_admits_above_the_band_and_pin_exempts_from_parking(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=1000) as h:
        await h.chat("s1", max_tokens=900)
        results = Results()
        async with anyio.create_task_group() as tg:
            results.spawn(tg, h, "s2", max_tokens=300)
            await settle(lambda: held(h) == 1, "s2 waiting")
            r = await h.client.post("/control/sessions/s2/unpark", headers=OP_HEADERS, json={"pin": True})
            assert r.status_code == 200
        assert results.done == [("s2", 200)]
        assert h.cp.budgeter.demand_tokens() > 950  # above the high band, by operator decision
        assert h.cp.budgeter.park_set() == ["s1"]  # s2 is pinned: s1 is parked instead
        assert (await h.chat("s2", max_tokens=300)).status_code == 200
        s2 = (await h.client.get("/sessions/s2")).json()
        assert s2["pinned"] and s2["state"] == "admitted"


async def test_switching_mode_to_off_releases_everyone(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=1000) as h:
        await h.chat("s1", max_tokens=900)
        results = Results()
        async with anyio.create_task_group() as tg:
            for sid in ("s2", "s3"):
                results.spawn(tg, h, sid, max_tokens=300)
            await settle(lambda: held(h) == 2, "two waiting")
            r = await h.client.put("/control/budgeter", headers=OP_HEADERS, json={"mode": "off"})
            assert r.status_code == 200
        assert sorted(results.done) == [("s2", 200), ("s3", 200)]


async def test_ending_a_session_with_a_held_turn_answers_409(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=100_000) as h:
        await h.chat("s1")
        await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS)
        results = Results()
        async with anyio.create_task_group() as tg:
            results.spawn(tg, h, "s1")
            await settle(lambda: held(h) == 1, "held")
            await h.client.delete("/sessions/s1", headers=OP_HEADERS)
        assert results.done == [("s1", 409)]


async def test_a_held_client_that_goes_away_loses_nothing(tmp_path: Path) -> None:
    """ControlPlane level (the process test does it over a real socket)."""
    async with sidecar(tmp_path, pool_tokens=100_000) as h:
        await h.chat("s1")
        await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS)
        parked_since = (await h.client.get("/sessions/s1")).json()["parked_since"]
        h.cp.request_turn("s1", 10, None)

        async def gone() -> None:
            return None

        assert await h.cp.hold("s1", gone) == "disconnected"
        s1 = (await h.client.get("/sessions/s1")).json()
        assert s1["state"] == "parked" and s1["manual"] and s1["parked_since"] == parked_since
        assert h.cp.held_requests == 0 and h.cp.budgeter.session("s1").held is False


# --------------------------------------------------------------------------- properties

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.integers(0, 5), st.integers(0, 600), st.integers(1, 400)),
        st.tuples(st.just("finish"), st.integers(0, 5), st.integers(0, 300), st.booleans()),
        st.tuples(st.just("end"), st.integers(0, 5)),
        st.tuples(st.just("park"), st.integers(0, 5)),
        st.tuples(st.just("unpark"), st.integers(0, 5), st.booleans()),
        st.tuples(
            st.just("release"),
        ),
    ),
    max_size=40,
)


async def _never() -> None:
    await asyncio.Event().wait()


def run_property(ops: list[tuple[Any, ...]], pool: int) -> None:
    async def main() -> None:
        clock = FakeClock()
        cp = ControlPlane(Settings(pool_tokens=pool, max_hold_s=3600), None, clock)
        in_flight: dict[str, int] = {}
        holders: dict[str, list[asyncio.Task[str]]] = {}
        low, high = cp.budgeter.band_tokens() or (0, 0)

        def forwarded(sid: str) -> None:
            in_flight[sid] = in_flight.get(sid, 0) + 1

        async def drain() -> None:
            for _ in range(10):  # let woken hold() coroutines run to completion
                await asyncio.sleep(0)
            for sid, tasks in list(holders.items()):
                for task in list(tasks):
                    if task.done():
                        tasks.remove(task)
                        outcome = task.result()
                        if outcome == "forward":
                            forwarded(sid)
                        elif outcome == "retry":
                            decision = cp.request_turn(sid, 10, None)
                            if decision == "forward":
                                forwarded(sid)
                            else:
                                tasks.append(asyncio.ensure_future(cp.hold(sid, _never)))
            for sid in [s for s, t in holders.items() if not t]:
                del holders[sid]

        for op in ops:
            clock.advance(1)
            kind = op[0]
            if kind == "request":
                sid = f"s{op[1]}"
                known = sid in cp.budgeter
                boundary = known and in_flight.get(sid, 0) == 0 and sid not in holders
                demand_before = cp.budgeter.demand_tokens()
                was = cp.budgeter.session(sid).state if known else None
                mid_turn = in_flight.get(sid, 0) > 0
                decision = cp.request_turn(sid, op[2], op[3])
                if mid_turn:
                    assert decision == "forward"  # never held mid-turn
                if boundary and was == "admitted":
                    # at a turn boundary (demand now counting the new prompt and budget) an admitted session
                    # is parked exactly when the band puts it in the park set, and forwarded otherwise
                    if decision == "hold":
                        assert cp.budgeter.session(sid).state == "parked"
                    else:
                        assert sid not in cp.budgeter.park_set()
                if decision == "forward":
                    forwarded(sid)
                    if not known and cp.budgeter.counts()["admitted"] > 1 and not cp.budgeter._unsessioned:
                        assert demand_before < low  # a new session only enters below the low band
                else:
                    holders.setdefault(sid, []).append(asyncio.ensure_future(cp.hold(sid, _never)))
            elif kind == "finish":
                sid = f"s{op[1]}"
                if in_flight.get(sid):
                    in_flight[sid] -= 1
                    cp.turn_done(sid, op[2], op[2] // 2, 5, 0.1, op[3], None)
                    cp.release()
            elif kind == "end":
                cp.end_session(f"s{op[1]}", "client")
                in_flight.pop(f"s{op[1]}", None)
            elif kind == "park":
                if f"s{op[1]}" in cp.budgeter:
                    cp.budgeter.park(f"s{op[1]}", clock())
            elif kind == "unpark":
                if f"s{op[1]}" in cp.budgeter and cp.budgeter.unpark(f"s{op[1]}", clock(), pin=op[2]):
                    cp._wake(f"s{op[1]}", "forward")
            else:
                cp.release()
            await drain()
            assert cp.budgeter.demand_tokens() >= 0
            for sid in holders:  # a held request always belongs to a session that is not admitted
                if sid in cp.budgeter:
                    assert cp.budgeter.session(sid).state != "admitted" or not holders[sid], sid
        # load falls: every turn finishes, every admitted session ends; every held turn gets forwarded
        for _ in range(50):
            for sid, n in list(in_flight.items()):
                for _ in range(n):
                    cp.turn_done(sid, 10, 5, 5, 0.1, True, None)
                in_flight[sid] = 0
            for s in cp.budgeter.sessions():
                if s.state == "admitted":
                    cp.end_session(s.id, "client")
                elif s.state == "parked" and s.manual and cp.budgeter.unpark(s.id, clock(), pin=False):
                    cp._wake(s.id, "forward")
            cp.release()
            await drain()
            if not holders:
                break
        assert not holders, f"held forever: {list(holders)}"
        for task in [t for ts in holders.values() for t in ts]:
            task.cancel()

    asyncio.run(main())


@settings(max_examples=150, deadline=None)
@given(OPS, st.sampled_from([500, 2000, 100_000]))
def test_property_no_held_turn_is_stranded_and_demand_never_negative(
    ops: list[tuple[Any, ...]], pool: int
) -> None:
    run_property(ops, pool)


async def test_demand_is_context_or_prompt_in_flight_plus_output_budget(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=1_000_000, default_output_budget=1024) as h:
        await h.chat("a", max_tokens=100)
        await h.chat("b", max_tokens=None)  # no max_tokens: the default output budget counts
        sessions = {s["id"]: s for s in (await h.client.get("/sessions")).json()}
        expected = sessions["a"]["context_tokens"] + 100 + sessions["b"]["context_tokens"] + 1024
        assert (await h.state())["budgeter"]["demand_tokens"] == expected
        async with anyio.create_task_group() as tg:
            # a turn in flight whose prompt (~2,500 tokens at 4 characters each) exceeds the last context
            tg.start_soon(
                lambda: h.chat("a", content="x" * 10_000, max_tokens=50, headers={"x-stub-delay-ms": "150"})
            )
            await settle(lambda: h.cp.in_flight == 1, "a in flight")
            in_flight = h.cp.budgeter.session("a")
            assert in_flight.inflight_prompt >= 2500
            assert (
                h.cp.budgeter.demand_tokens()
                == in_flight.inflight_prompt + 50 + sessions["b"]["context_tokens"] + 1024
            )
            # the listing says it: the forecast starts this turn with that prompt (simulator.forecast)
            listed = (await h.client.get("/sessions/a")).json()
            assert listed["pending_prompt_tokens"] == in_flight.inflight_prompt
            assert listed["demand_tokens"] == in_flight.inflight_prompt + 50
        listed = (await h.client.get("/sessions/a")).json()
        assert listed["pending_prompt_tokens"] == 0 and listed["in_flight"] == 0  # answered: nothing pending


async def test_a_prompt_in_flight_is_its_session_s_last_count_plus_the_added_text(tmp_path: Path) -> None:
    """The engine's count of a session's previous prompt, not characters / 4, is what its next prompt in flight
    starts from (core.prompt_estimate): a chat template's tokens no character accounts for stay counted."""
    system = "You are terse."  # 14 characters
    async with sidecar(tmp_path, pool_tokens=1_000_000) as h:
        assert (await h.state())["budgeter"]["chars_per_token_source"] == "configured"
        usage = '{"prompt_tokens": 1300, "completion_tokens": 10}'  # ~1,004 tokens at 4 characters each
        await h.chat("a", content="x" * 4000, headers={"x-stub-usage": usage})
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: h.chat("a", content="x" * 4400, max_tokens=50, headers={"x-stub-delay-ms": "150"})
            )
            tg.start_soon(
                lambda: h.chat("b", content="x" * 4400, max_tokens=50, headers={"x-stub-delay-ms": "150"})
            )
            await settle(lambda: h.cp.in_flight == 2, "a and b in flight")
            assert h.cp.budgeter.session("a").inflight_prompt == 1300 + 100  # 400 more characters
            listed = (await h.client.get("/sessions/a")).json()
            assert listed["pending_prompt_tokens"] == 1400
            assert h.cp.budgeter.session("b").inflight_prompt == -(-(4400 + len(system)) // 4)  # nothing seen
        assert h.cp.prompts.remembered() == 2
        r = await h.client.delete("/sessions/a", headers=OP_HEADERS)
        assert r.status_code == 200, r.text
        assert h.cp.prompts.remembered() == 1  # an ended session is forgotten


async def test_pool_comes_from_the_engine_and_is_refreshed(tmp_path: Path) -> None:
    engine = StubEngine(pool_tokens=40_000)
    async with sidecar(tmp_path, engine=engine, pool_refresh_s=0.05) as h:
        await settle(lambda: h.cp.budgeter.pool_tokens == 40_000, "pool from the engine")
        state = await h.state()
        assert state["budgeter"]["pool_source"] == "engine" and state["engine_kind"] == "vllm"
        engine.pool_tokens = 80_000
        await settle(lambda: h.cp.budgeter.pool_tokens == 80_000, "pool refreshed")
    async with sidecar(tmp_path, engine=StubEngine(pool_tokens=40_000), pool_tokens=1234) as h:
        assert (await h.state())["budgeter"]["pool_tokens"] == 1234  # --pool-tokens overrides the engine


async def test_without_a_pool_size_the_bands_do_not_act(tmp_path: Path) -> None:
    async with sidecar(tmp_path, engine=StubEngine(metrics=False)) as h:
        await settle(lambda: h.cp.pool_error is not None, "pool fetch finished")
        for i in range(5):
            assert (await h.chat(f"s{i}", max_tokens=10_000_000)).status_code == 200
        state = await h.state()
        assert state["budgeter"]["pool_tokens"] is None and state["budgeter"]["acting"] is False
        assert state["backlog"]["admitted"] == 5 and state["backlog"]["held_requests"] == 0
        assert any("KV pool size unknown" in w and "--pool-tokens" in w for w in state["warnings"])


async def test_session_cap_park_mode_caps_admitted_sessions(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=1_000_000) as h:
        r = await h.client.put(
            "/control/budgeter", headers=OP_HEADERS, json={"mode": "session-cap-park", "session_cap": 1}
        )
        assert r.status_code == 200
        await h.chat("first")
        results = Results()
        async with anyio.create_task_group() as tg:
            results.spawn(tg, h, "second")
            await settle(lambda: held(h) == 1, "second waits")
            assert (await h.state())["backlog"]["waiting"] == 1
            await h.client.delete("/sessions/first", headers=OP_HEADERS)
        assert results.done == [("second", 200)]


async def test_parking_a_session_frees_room_for_waiting_ones_at_once(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=1000) as h:
        await h.chat("big", max_tokens=900)
        results = Results()
        async with anyio.create_task_group() as tg:
            results.spawn(tg, h, "small", max_tokens=10)
            await settle(lambda: held(h) == 1, "small waits")
            r = await h.client.post("/control/sessions/big/park", headers=OP_HEADERS)
            assert r.status_code == 200  # no periodic tick runs in these tests: the park itself released
        assert results.done == [("small", 200)]
