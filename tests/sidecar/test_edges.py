"""Issue 11, the sidecar's edges: each test reproduces a fault of the red-team pass first.

item 3  one request cannot freeze admission      item 5  every accepted session id can be controlled
item 6  state changes authenticated, no cross-site  item 7  errors keep their documented shape
item 8  many clients are bounded                   item 10 the sidecar fails open and says so
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import pytest

from .conftest import OP_HEADERS, OPERATOR, VIEWER, sidecar

pytestmark = pytest.mark.anyio
JSON = {"Content-Type": "application/json"}


def shaped(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    """The documented OpenAI-shaped error, never a plain-text 500 or a traceback."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert err["type"] == kind and err["code"] == status and err["message"], err
    assert "Traceback" not in r.text
    return dict(err)


# ------------------------------------------------------------------------- item 3


async def test_a_huge_max_tokens_does_not_freeze_admission(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:  # the stub: a 400,000-token pool, max_model_len 131,072
        for _ in range(200):
            if h.cp.context_length is not None:
                break
            await anyio.sleep(0.01)
        assert h.cp.context_length == 131_072
        # the engine refuses it (as vLLM does above its context length): the failed turn's budget leaves demand
        r = await h.chat("hog", max_tokens=10**12, headers={"x-stub-status": "400"})
        assert r.status_code == 400
        assert h.cp.budgeter.session("hog").output_budget == 0 and h.cp.budgeter.demand_tokens() == 0
        with anyio.fail_after(5):  # before the fix: every new session held for --max-hold, then 503
            assert (await h.chat("next", max_tokens=16)).status_code == 200
        # the engine serves it: its budget was clamped to the context length, so others are still admitted
        assert (await h.chat("hog2", max_tokens=10**12)).status_code == 200
        hog2 = h.cp.budgeter.session("hog2")
        assert (
            hog2.demand_tokens <= 131_072 + hog2.context_tokens < 0.75 * 400_000
        )  # the estimate vs the real prompt
        with anyio.fail_after(5):
            assert (await h.chat("after", max_tokens=16)).status_code == 200


async def test_a_prompt_larger_than_the_high_band_is_refused_with_a_clear_4xx(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=1000) as h:
        err = shaped(await h.chat("big", content="x" * 8000), 400, "request_too_large")
        assert err["param"] == "messages" and "high band" in err["message"]
        assert "big" not in h.cp.budgeter and h.cp.budgeter.demand_tokens() == 0
        assert (await h.chat("small")).status_code == 200


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 10**30, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 3}},
        {"prompt_tokens": -7, "completion_tokens": 5},
        {"prompt_tokens": 10, "completion_tokens": 10**18},
        {"prompt_tokens": "many", "completion_tokens": None},
        {"prompt_tokens": 1e308, "completion_tokens": 1},
    ],
)
async def test_out_of_range_engine_usage_never_enters_demand(tmp_path: Path, usage: dict[str, Any]) -> None:
    async with sidecar(tmp_path, pool_tokens=100_000) as h:
        r = await h.chat("s1", headers={"x-stub-usage": json.dumps(usage)})
        assert r.status_code == 200
        assert h.cp.budgeter.demand_tokens() <= 100_000
        assert h.cp.counters.prompt_tokens <= 100_000
        assert (await h.chat("s2")).status_code == 200


# ------------------------------------------------------------------------- item 5


@pytest.mark.parametrize("session", ["tenant/agent", "a/b/c", "x.y", "v1.2/agent", "..x", "a..b/c"])
@pytest.mark.parametrize("encoded", [False, True])
async def test_session_ids_with_slashes_and_dots_can_be_controlled(
    tmp_path: Path, session: str, encoded: bool
) -> None:
    async with sidecar(tmp_path, pool_tokens=100_000) as h:
        assert (await h.chat(session)).status_code == 200
        path = quote(session, safe="") if encoded else session
        got = await h.client.get(f"/sessions/{path}")
        assert got.status_code == 200 and got.json()["id"] == session, got.text
        r = await h.client.post(f"/control/sessions/{path}/park", headers=OP_HEADERS)
        assert r.status_code == 200 and r.json()["session"]["state"] == "parked", r.text
        r = await h.client.post(f"/control/sessions/{path}/unpark", headers=OP_HEADERS)
        assert r.status_code == 200 and r.json()["session"]["state"] == "admitted", r.text
        r = await h.client.delete(f"/sessions/{path}", headers=OP_HEADERS)
        assert r.status_code == 200 and r.json()["session"]["id"] == session, r.text
        audit = (await h.client.get("/audit")).json()
        assert [a["params"]["session"] for a in audit] == [session] * 3


@pytest.mark.parametrize("session", [".", "..", "a/../b", "a/./b", "tenant/..", "./x"])
async def test_session_ids_urls_cannot_address_are_refused_at_the_proxy(tmp_path: Path, session: str) -> None:
    async with sidecar(tmp_path) as h:
        err = shaped(await h.chat(session), 400, "invalid_request")
        assert err["param"] == "X-Session-Id"
        assert h.cp.budgeter.counts() == {"admitted": 0, "parked": 0, "waiting": 0}
        # and the list is never what a '.' id answers
        assert (await h.client.get("/sessions/%2E")).status_code == 404


# ------------------------------------------------------------------------- item 6


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        None,
        "application/jsonx",
        "text/json",
    ],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/compaction/requests"),
        ("PUT", "/control/budgeter"),
        ("POST", "/v1/embeddings"),
    ],
)
async def test_non_json_bodies_get_415(
    tmp_path: Path, content_type: str | None, method: str, path: str
) -> None:
    async with sidecar(tmp_path) as h:
        headers = {**OP_HEADERS, **({"Content-Type": content_type} if content_type else {})}
        body = b'{"subtrees": ["a"], "mode": "off", "model": "stub-model", "messages": []}'
        shaped(
            await h.client.request(method, path, content=body, headers=headers), 415, "unsupported_media_type"
        )
        assert h.cp.budgeter.config.mode == "budgeter-park" and h.cp.decision_counts == {}
        assert h.engine.requests == 0
        r = await h.client.request(
            method,
            path,
            content=body,
            headers={**OP_HEADERS, "Content-Type": "application/json; charset=utf-8"},
        )
        assert r.status_code != 415


async def test_delete_session_needs_the_operator_or_the_client_token(tmp_path: Path) -> None:
    client = "client-token-789"
    async with sidecar(tmp_path, viewer_token=VIEWER, client_token=client) as h:
        bearer = {"Authorization": f"Bearer {client}"}
        assert (await h.chat("s1", headers=bearer)).status_code == 200
        await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS)
        for headers in ({}, {"Authorization": f"Bearer {VIEWER}"}, {"Authorization": "Bearer nope"}):
            shaped(await h.client.delete("/sessions/s1", headers=headers), 401, "unauthorized")
        assert h.cp.budgeter.session("s1").state == "parked"  # the operator's park survives
        r = await h.client.delete("/sessions/s1", headers=bearer)
        assert r.status_code == 200
        assert (await h.client.get("/audit", headers=OP_HEADERS)).json()[-1]["actor"] == "client"
        assert (await h.chat("s2", headers=bearer)).status_code == 200
        r = await h.client.delete("/sessions/s2", headers=OP_HEADERS)
        assert r.status_code == 200
        assert (await h.client.get("/audit", headers=OP_HEADERS)).json()[-1]["actor"] == "alice"


async def test_client_token_guards_traffic_session_end_and_compaction_requests(tmp_path: Path) -> None:
    client = "client-token-789"
    async with sidecar(tmp_path, client_token=client) as h:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            shaped(await h.chat("s1", headers=headers), 401, "unauthorized")
            shaped(
                await h.client.post("/compaction/requests", json={"subtrees": ["a"]}, headers=headers),
                401,
                "unauthorized",
            )
            shaped(await h.client.get("/v1/models", headers=headers), 401, "unauthorized")
        assert h.engine.requests == 0 and h.cp.decision_counts == {}
        for token in (client, OPERATOR):
            ok = {"Authorization": f"Bearer {token}"}
            assert (await h.chat("s1", headers=ok)).status_code == 200
            assert (
                await h.client.post("/compaction/requests", json={"subtrees": ["a"]}, headers=ok)
            ).status_code == 200
        assert (await h.client.get("/state")).status_code == 200  # reads follow the viewer token only


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8100", "127.0.0.2", "localhost.evil.example", "[::2]", ""]
)
async def test_unknown_host_headers_get_421(tmp_path: Path, host: str) -> None:
    async with sidecar(tmp_path) as h:
        for method, path in (("GET", "/state"), ("GET", "/metrics"), ("POST", "/v1/chat/completions")):
            r = await h.client.request(method, path, headers={"Host": host, **JSON}, content=b"{}")
            shaped(r, 421, "misdirected_request")
        for ok in ("127.0.0.1", "localhost:8100", "[::1]:8100", "LOCALHOST"):
            assert (await h.client.get("/state", headers={"Host": ok})).status_code == 200, ok


async def test_allowed_hosts_flag(tmp_path: Path) -> None:
    async with sidecar(tmp_path, allowed_hosts=("sidecar.internal",)) as h:
        assert (await h.client.get("/state", headers={"Host": "sidecar.internal:8100"})).status_code == 200
        assert (await h.client.get("/state", headers={"Host": "localhost"})).status_code == 421
    async with sidecar(tmp_path, allowed_hosts=("*",)) as h:
        assert (await h.client.get("/state", headers={"Host": "anything.example"})).status_code == 200


# ------------------------------------------------------------------------- item 7


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("PUT", "/control/budgeter"),
        ("POST", "/compaction/requests"),
        ("POST", "/control/sessions/s1/park"),
    ],
)
@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_deeply_nested_json_is_a_shaped_400(tmp_path: Path, method: str, path: str, depth: int) -> None:
    async with sidecar(tmp_path, control_body_bytes=1_000_000) as h:
        body = b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
        r = await h.client.request(method, path, content=body, headers={**OP_HEADERS, **JSON})
        assert 400 <= r.status_code < 500, r.text[:300]
        assert r.json()["error"]["type"] in ("invalid_request", "invalid_value", "unknown_session")


async def test_chunked_oversize_control_bodies_get_the_documented_413(tmp_path: Path) -> None:
    async with sidecar(tmp_path, control_body_bytes=100) as h:

        async def chunks() -> Any:
            for _ in range(50):
                yield b'{"mode": "off"' + b" " * 20 + b"}"

        for path, method in (("/control/budgeter", "PUT"), ("/compaction/requests", "POST")):
            r = await h.client.request(method, path, content=chunks(), headers={**OP_HEADERS, **JSON})
            shaped(r, 413, "body_too_large")
        assert h.cp.budgeter.config.mode == "budgeter-park"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("DELETE", "/state", 405),
        ("PATCH", "/control/budgeter", 405),
        ("GET", "/control/budgeter", 405),
    ],
)
async def test_starlette_errors_keep_the_shape(tmp_path: Path, method: str, path: str, status: int) -> None:
    async with sidecar(tmp_path) as h:
        r = await h.client.request(method, path, headers=OP_HEADERS)
        assert r.status_code == status and r.json()["error"]["code"] == status, r.text


# ------------------------------------------------------------------------- item 8


async def test_max_sessions_evicts_the_oldest_idle_and_reports_it(tmp_path: Path) -> None:
    async with sidecar(tmp_path, max_sessions=3, pool_tokens=100_000) as h:
        for i in range(3):
            assert (await h.chat(f"s{i}")).status_code == 200
            h.clock.advance(1)
        assert (await h.chat("s3")).status_code == 200
        ended = (await h.client.get("/sessions/s0")).json()
        assert ended["state"] == "ended" and ended["end_reason"] == "evicted"
        assert (await h.state())["backlog"]["total"] == 3
        assert (
            'prefixops_sidecar_sessions_ended_total{reason="evicted"} 1.0'
            in (await h.client.get("/metrics")).text
        )


async def test_a_slow_body_gets_408_after_the_read_timeout(tmp_path: Path) -> None:
    async with sidecar(tmp_path, read_timeout_s=0.3) as h:

        async def slow() -> Any:
            yield b'{"model": "stub-model", '
            await anyio.sleep(5)
            yield b'"messages": []}'

        for path, method in (("/v1/chat/completions", "POST"), ("/control/budgeter", "PUT")):
            with anyio.fail_after(4):
                r = await h.client.request(method, path, content=slow(), headers={**OP_HEADERS, **JSON})
            shaped(r, 408, "request_timeout")


# ------------------------------------------------------------------------ item 10


async def test_fails_open_when_the_state_store_is_locked(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=100_000) as h:
        assert (await h.chat("s1")).status_code == 200
        locker = sqlite3.connect(h.settings.state_db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            # traffic keeps flowing, the periodic persist fails without stopping anything
            assert (await h.chat("s2")).status_code == 200
            h.clock.advance(10)
            h.cp.tick()
            assert (await h.chat("s1")).status_code == 200
            health = (await h.client.get("/healthz")).json()
            assert health["status"] == "degraded" and "cannot be written" in health["reasons"][0]
            # control changes that cannot be persisted are refused, and nothing changed
            r = await h.client.put("/control/budgeter", json={"mode": "off"}, headers=OP_HEADERS)
            err = shaped(r, 503, "not_persisted")
            assert "not applied" in err["message"]
            assert h.cp.budgeter.config.mode == "budgeter-park"
            shaped(await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS), 503, "not_persisted")
            assert h.cp.budgeter.session("s1").state == "admitted"
            shaped(await h.client.delete("/sessions/s1", headers=OP_HEADERS), 503, "not_persisted")
            r = await h.client.post("/compaction/requests", json={"subtrees": ["a"]})
            assert r.status_code == 200 and r.json()["granted"] == ["a"]
            assert (await h.state())["health"] == "degraded"
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        h.clock.advance(10)
        h.cp.tick()
        assert (await h.client.get("/healthz")).json() == {
            **(await h.client.get("/healthz")).json(),
            "status": "ok",
            "reasons": [],
        }
        r = await h.client.put("/control/budgeter", json={"mode": "off"}, headers=OP_HEADERS)
        assert r.status_code == 200
        rows = sqlite3.connect(h.settings.state_db).execute("SELECT id FROM sessions ORDER BY id").fetchall()
        assert rows == [("s1",), ("s2",)]  # nothing written during the lock was lost


async def test_fails_open_when_the_engine_metrics_are_unreadable(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_refresh_s=0.05) as h:
        assert h.cp.budgeter.pool_tokens is not None
        h.engine.metrics_status = 500  # type: ignore[attr-defined]
        for _ in range(200):
            if h.cp.pool_error is not None:
                break
            await anyio.sleep(0.01)
        assert (await h.chat("s1")).status_code == 200
        health = (await h.client.get("/healthz")).json()
        assert health["status"] == "degraded" and "metrics" in health["reasons"][0]


def test_slowloris_connections_are_closed_after_the_read_timeout(tmp_path: Path) -> None:
    import socket
    import time

    from .test_process import sidecar_process, stub_engine

    with (
        stub_engine() as engine,
        sidecar_process(engine, tmp_path / "s.db", "--read-timeout", "1") as (base, _),
    ):
        port = int(base.rsplit(":", 1)[1])
        socks = []
        for _ in range(100):  # a partial request head each, never completed
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(s)
        time.sleep(1.5)
        closed = 0
        deadline = time.monotonic() + 10
        for s in socks:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                closed += s.recv(1) == b""
            except ConnectionError:  # reset by the server: closed too
                closed += 1
            except TimeoutError:  # still open: the fault
                pass
            s.close()
        assert closed == 100
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200  # and the sidecar still serves


async def test_an_open_sidecar_lets_clients_end_their_sessions(tmp_path: Path) -> None:
    async with sidecar(tmp_path, operator_token=None) as h:  # no token configured anywhere
        await h.chat("s1")
        r = await h.client.delete("/sessions/s1")
        assert r.status_code == 200 and r.json()["session"]["end_reason"] == "deleted"


async def test_a_held_turn_outlives_the_read_timeout(tmp_path: Path) -> None:
    """The read deadline covers receiving the request, not the hold that follows it."""
    async with sidecar(tmp_path, pool_tokens=100_000, read_timeout_s=0.2) as h:
        await h.chat("s1")
        await h.client.post("/control/sessions/s1/park", headers=OP_HEADERS)
        async with anyio.create_task_group() as tg:
            result: list[int] = []

            async def turn() -> None:
                result.append((await h.chat("s1")).status_code)

            tg.start_soon(turn)
            await anyio.sleep(0.6)
            assert h.cp.held_requests == 1
            await h.client.post("/control/sessions/s1/unpark", headers=OP_HEADERS)
        assert result == [200]


def test_a_slow_body_is_cut_by_the_server(tmp_path: Path) -> None:
    import socket
    import time

    from .test_process import sidecar_process, stub_engine

    with (
        stub_engine() as engine,
        sidecar_process(engine, tmp_path / "s.db", "--read-timeout", "1") as (base, _),
    ):
        port = int(base.rsplit(":", 1)[1])
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        started = time.monotonic()
        try:
            data = s.recv(1)
        except ConnectionError:
            data = b""
        assert data == b"" and time.monotonic() - started < 8
        s.close()


async def test_a_huge_budget_saved_before_the_clamp_is_capped_after_a_restart(tmp_path: Path) -> None:
    from tests.stubs.stub_engine import StubEngine

    # a sidecar that knew neither the pool nor the context length stored a 10^12-token output budget
    async with sidecar(tmp_path, engine=StubEngine(metrics=False, max_model_len=None)) as h:
        assert h.cp.context_length is None
        assert h.cp.budgeter.pool_tokens is None
        assert (await h.chat("hog", max_tokens=10**12)).status_code == 200
        assert h.cp.budgeter.session("hog").output_budget == 10**12
    async with sidecar(tmp_path) as h:  # same state db; the engine says pool 400,000, context 131,072
        with anyio.fail_after(60):  # the first engine poll; slow on a loaded machine
            while h.cp.context_length is None:
                await anyio.sleep(0.01)
        assert h.cp.restored and h.cp.budgeter.session("hog").demand_tokens <= 131_072
        with anyio.fail_after(5):
            assert (await h.chat("next", max_tokens=16)).status_code == 200
