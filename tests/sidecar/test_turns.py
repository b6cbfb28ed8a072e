"""The turn trace: every turn recorded (no prompt content), GET /turns pages, viewer auth, retention."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from sidecar import wire
from sidecar.store import Store
from sidecar.turns import PRUNE_EVERY_S, TurnLog

from .conftest import OP_HEADERS, VIEWER, settle, sidecar

pytestmark = pytest.mark.anyio
SECRET = "the secret prompt text 1234"


async def test_every_turn_is_recorded_without_prompt_content(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=100_000, viewer_token=VIEWER) as h:
        assert (await h.client.get("/turns")).status_code == 401
        await h.chat("s1", content=SECRET, headers={"X-Prefix-Id": "doc"})
        h.clock.advance(2)
        await h.chat("s1", content=SECRET + " again", stream=True, headers={"X-Prefix-Id": "doc"})
        await h.chat(None, content="no session")
        r = await h.client.get("/turns", headers={"Authorization": f"Bearer {VIEWER}"})
        assert r.status_code == 200, r.text
        page = wire.TurnsPage.model_validate(r.json())
        assert [t.id for t in page.turns] == [1, 2, 3] and page.next_after_id == 3
        first, second, third = page.turns
        assert (first.session, first.subtree, first.outcome, first.model) == ("s1", "doc", "ok", "stub-model")
        assert first.prompt_tokens and first.prompt_tokens > 0 and first.completion_tokens is not None
        assert first.cached_tokens is not None and first.latency_s is not None and first.latency_s >= 0
        assert first.held_s == 0.0 and first.parked_s == 0.0
        assert second.ts == first.ts + 2 and second.outcome == "ok"
        assert third.session is None
        # after_id / limit pages; the end answers the same cursor back
        r = await h.client.get("/turns", params={"after_id": 1, "limit": 1}, headers=OP_HEADERS)
        assert [t["id"] for t in r.json()["turns"]] == [2] and r.json()["next_after_id"] == 2
        r = await h.client.get("/turns", params={"after_id": 3}, headers=OP_HEADERS)
        assert r.json() == {"turns": [], "next_after_id": 3}
        assert (await h.client.get("/turns", params={"limit": 0}, headers=OP_HEADERS)).status_code == 422
        h.cp.flush_turns()
    with sqlite3.connect(tmp_path / "sidecar.db") as db:
        dump = "\n".join(db.iterdump())
    assert 'INSERT INTO "turns"' in dump and "secret" not in dump and "no session" not in dump


async def test_held_and_parked_time_and_refused_holds_are_traced(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=100_000, max_hold_s=0.2) as h:
        await h.chat("s1")
        await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS)
        h.clock.advance(5)
        assert (await h.chat("s1")).status_code == 503  # held past max-hold
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.chat, "s1")
            await settle(lambda: h.cp.held_requests == 1, "s1 held")
            h.clock.advance(3)
            await h.client.post("/control/sessions/s1/unpark", headers=OP_HEADERS)
        turns = (await h.client.get("/turns", headers=OP_HEADERS)).json()["turns"]
        assert [t["outcome"] for t in turns] == ["ok", "held_503", "ok"]
        assert turns[1]["prompt_tokens"] is None and turns[1]["parked_s"] == turns[1]["held_s"]
        assert turns[2]["held_s"] == 3.0 and turns[2]["parked_s"] == 3.0


def test_flush_writes_in_batches_and_prunes_past_the_retention(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    log = TurnLog(store, retention_s=100.0)
    for i in range(5):
        log.record(1000.0 + i, f"s{i}", None, 10, 5, 1, 0.0, 0.0, 0.01, "ok", "m" * 500)
    assert log.page()["turns"] == []  # buffered: nothing written on the hot path
    log.flush(1004.0)
    page = log.page()
    assert [t["session"] for t in page["turns"]] == ["s0", "s1", "s2", "s3", "s4"] and log.buffer == []
    assert len(page["turns"][0]["model"]) == 200
    log.record(1200.0, "late", None, 10, 5, 1, 0.0, 0.0, 0.01, "ok", None)
    log.flush(1004.0 + PRUNE_EVERY_S + 150.0)  # cutoff 1058: everything before it is gone
    assert [t["session"] for t in log.page()["turns"]] == ["late"]
    store.close()


def test_a_store_that_cannot_be_written_keeps_the_buffer(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    log = TurnLog(store, retention_s=100.0)
    log.record(1.0, "s", None, 10, 5, 1, 0.0, 0.0, 0.01, "ok", None)
    store._db.execute("CREATE TRIGGER no_turns BEFORE INSERT ON turns BEGIN SELECT RAISE(ABORT, 'full'); END")
    with pytest.raises(sqlite3.Error):
        log.flush(2.0)
    assert len(log.buffer) == 1
    store._db.execute("DROP TRIGGER no_turns")
    log.flush(3.0)
    assert log.buffer == [] and [t["session"] for t in log.page()["turns"]] == ["s"]
    store.close()


async def test_a_turn_cancelled_at_the_engine_is_recorded_failed_and_leaves_nothing_in_flight(
    tmp_path: Path,
) -> None:
    """The sidecar stopping with a non-streamed turn still at the engine (uvicorn cancels what outlives
    its graceful shutdown): the trace keeps the turn, failed, as a broken stream's is."""
    async with sidecar(tmp_path, pool_tokens=100_000) as h:

        async def held_at_the_engine() -> None:
            await h.chat("s1", headers={"x-stub-wait-for": "never"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(held_at_the_engine)
            await settle(lambda: h.cp.in_flight == 1, "the turn at the engine")
            tg.cancel_scope.cancel()
        assert h.cp.in_flight == 0
        turns = (await h.client.get("/turns", headers=OP_HEADERS)).json()["turns"]
        assert [(t["session"], t["outcome"], t["completion_tokens"]) for t in turns] == [
            ("s1", "error", None)
        ]
        assert (await h.client.get("/sessions/s1")).json()["failed_turns"] == 1
