"""The collectors' copy of the turn trace: pages of GET /turns, cursor advanced only after a commit."""

from __future__ import annotations

import httpx

from collectors.turn_trace import turn_row
from tests.support import FakeClock

from .test_scrape import FULL_STATE, client_for, sidecar_handler, sidecar_scraper


def turn(i: int, **kw: object) -> dict:
    return {
        "id": i,
        "ts": float(i),
        "session": f"s{i % 3}",
        "subtree": "doc",
        "prompt_tokens": 100 + i,
        "cached_tokens": 50,
        "completion_tokens": 7,
        "held_s": 0.0,
        "parked_s": 0.0,
        "latency_s": 0.2,
        "outcome": "ok",
        "model": "m",
        **kw,
    }


def test_turns_are_read_in_pages_and_the_cursor_moves_only_after_commit():
    scraper = sidecar_scraper(FakeClock(1000.0))
    scraper.PAGE = 2  # three pages for five turns
    turns = [turn(i) for i in range(1, 6)]
    client = client_for(sidecar_handler(FULL_STATE, turns=turns))
    first = scraper.scrape(client)
    assert first.ok, first.error
    assert [t["remote_id"] for t in first.turns] == [1, 2, 3, 4, 5]
    assert first.turns[0] == {
        "remote_id": 1,
        "ts": 1.0,
        "session_id": "s1",
        "subtree_id": "doc",
        "prompt_tokens": 101,
        "cached_tokens": 50,
        "completion_tokens": 7,
        "held_s": 0.0,
        "parked_s": 0.0,
        "latency_s": 0.2,
        "outcome": "ok",
        "model": "m",
    }
    again = scraper.scrape(client)  # the writer has not committed `first`: read again
    assert [t["remote_id"] for t in again.turns] == [1, 2, 3, 4, 5]
    scraper.commit(first)
    assert scraper.cursors["turns"].after_id == 5
    turns.append(turn(6, outcome="held_503", prompt_tokens=None))
    third = scraper.scrape(client)
    assert [(t["remote_id"], t["outcome"], t["prompt_tokens"]) for t in third.turns] == [
        (6, "held_503", None)
    ]


def test_a_wiped_sidecar_log_starts_a_new_epoch_and_an_old_sidecar_has_no_turns():
    scraper = sidecar_scraper(FakeClock(1000.0))
    turns = [turn(1), turn(2)]
    client = client_for(sidecar_handler(FULL_STATE, turns=turns))
    scraper.commit(scraper.scrape(client))
    turns[:] = [turn(1, outcome="error")]  # id 2 is gone, id 1 differs: a new log
    out = scraper.scrape(client)
    assert out.turns_epoch == 1 and [t["remote_id"] for t in out.turns] == [1]

    def old_sidecar(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/turns":
            return httpx.Response(404, json={"detail": "Not Found"})
        return sidecar_handler(FULL_STATE)(request)

    out = sidecar_scraper(FakeClock(1000.0)).scrape(client_for(old_sidecar))
    assert out.ok and out.turns == []


def test_turn_rows_are_defensive():
    assert turn_row({"ts": 1.0}) is None
    row = turn_row({"id": 3, "prompt_tokens": "many", "session": 7, "outcome": "ok"})
    assert row is not None and row["prompt_tokens"] is None and row["session_id"] == "7"
