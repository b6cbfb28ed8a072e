"""The proxy: OpenAI endpoints forwarded (streaming and not), usage measured, sessions, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sidecar.app import create_app
from sidecar.settings import Settings
from sidecar.store import Store
from tests.stubs.stub_engine import StubEngine
from tests.support import free_port

from .conftest import OP_HEADERS, settle, sidecar

pytestmark = pytest.mark.anyio


def sse_events(text: str) -> list[Any]:
    out = []
    for block in text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_non_streaming_chat_is_forwarded_and_measured(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        long_system = "You answer questions about the fleet. " * 20
        first = await h.chat("s1", system=long_system)
        assert first.status_code == 200
        body = first.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        second = await h.chat("s1", system=long_system, content="again")
        usage = second.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0
        state = await h.state()
        reuse = state["reuse"]
        prompt = first.json()["usage"]["prompt_tokens"] + usage["prompt_tokens"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert reuse["turns"] == 2 and reuse["window_s"] == 60.0
        assert reuse["token_weighted"] == pytest.approx(cached / prompt)
        assert reuse["request_weighted"] == pytest.approx(0.5)
        assert reuse["divergence"] == pytest.approx(0.5 - cached / prompt)
        assert reuse["regime"] == "normal"
        assert state["reuse_last_turns"]["turns"] == 2
        assert "sessions" not in state and state["backlog"]["total"] == 1  # counts, not every session
        state = (await h.client.get("/state", params={"include_sessions": "true"})).json()
        [s] = [s for s in state["sessions"] if s["id"] == "s1"]
        assert s["turns"] == 2
        assert s["context_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert s["last_cached_fraction"] == pytest.approx(cached / usage["prompt_tokens"])


async def test_stream_without_include_usage_hides_the_usage_chunk_but_measures_it(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        r = await h.chat("s1", stream=True)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert chunks and all(c["choices"] for c in chunks)
        assert all("usage" not in c for c in chunks)
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).startswith("tok")
        # the engine was asked for usage, and the sidecar recorded it
        assert h.engine.seen_bodies[-1]["stream_options"] == {"include_usage": True}
        state = await h.state()
        assert state["reuse"]["turns"] == 1 and state["reuse"]["prompt_tokens"] > 0


async def test_stream_with_include_usage_passes_the_usage_chunk(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        r = await h.chat("s1", stream=True, stream_options={"include_usage": True})
        events = sse_events(r.text)
        usage_chunks = [e for e in events[:-1] if e.get("usage")]
        assert len(usage_chunks) == 1 and usage_chunks[0]["choices"] == []
        assert usage_chunks[0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert (await h.state())["reuse"]["turns"] == 1


async def test_completions_endpoint_and_models(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        r = await h.client.post(
            "/v1/completions",
            json={"model": "stub-model", "prompt": "x" * 400, "max_tokens": 4},
            headers={"X-Session-Id": "c1"},
        )
        assert r.status_code == 200 and r.json()["object"] == "text_completion"
        r = await h.client.post(
            "/v1/completions",
            json={"model": "stub-model", "prompt": "x" * 400, "stream": True},
            headers={"X-Session-Id": "c1"},
        )
        events = sse_events(r.text)
        assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])
        models = await h.client.get("/v1/models")
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "stub-model"
        assert (await h.state())["reuse"]["turns"] == 2


async def test_client_authorization_header_reaches_the_engine_untouched(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        await h.chat("s1", headers={"Authorization": "Bearer sk-client-key"})
        assert h.engine.seen_headers[-1]["authorization"] == "Bearer sk-client-key"
        assert (
            h.engine.seen_headers[-1]["x-session-id"] == "s1"
        )  # for session-affinity routers and sim: truth


async def test_engine_errors_pass_through_and_leave_context_unchanged(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        await h.chat("s1")
        before = (await h.client.get("/sessions/s1")).json()
        r = await h.chat("s1", headers={"x-stub-status": "500"})
        assert r.status_code == 500 and "error" in r.json()
        after = (await h.client.get("/sessions/s1")).json()
        assert after["context_tokens"] == before["context_tokens"] and after["turns"] == before["turns"]
        assert after["failed_turns"] == 1 and after["in_flight"] == 0
        unknown_model = await h.chat("s1", model="nope")
        assert (
            unknown_model.status_code == 404 and "does not exist" in unknown_model.json()["error"]["message"]
        )


async def test_engine_down_is_a_clear_502_not_a_hang(tmp_path: Path) -> None:
    settings = Settings(
        engine=f"http://127.0.0.1:{free_port()}",
        state_db=str(tmp_path / "down.db"),
        tick_s=3600,
        pool_refresh_s=3600,
    )
    app = create_app(settings, store=Store(settings.state_db))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://localhost") as client,
    ):
        for stream in (False, True):
            r = await client.post(
                "/v1/chat/completions",
                headers={"X-Session-Id": "s1"},
                json={"model": "m", "messages": [], "stream": stream},
            )
            assert r.status_code == 502
            assert r.json()["error"]["type"] == "engine_unavailable"
            assert "unreachable" in r.json()["error"]["message"]
        s = (await client.get("/sessions/s1")).json()
        assert s["in_flight"] == 0 and s["turns"] == 0
        state = (await client.get("/state")).json()
        assert any("engine errors" in w for w in state["warnings"])
        assert any("KV pool size unknown" in w for w in state["warnings"])
        assert state["budgeter"]["pool_tokens"] is None


async def test_broken_stream_ends_with_an_error_event(tmp_path: Path) -> None:
    async with sidecar(tmp_path, engine=StubEngine(completion_tokens=8)) as h:
        await h.chat("s1")
        before = (await h.client.get("/sessions/s1")).json()
        r = await h.chat("s1", stream=True, headers={"x-stub-break": "1"})
        events = sse_events(r.text)
        assert events[-1]["error"]["type"] == "engine_unavailable"
        after = (await h.client.get("/sessions/s1")).json()
        assert after["context_tokens"] == before["context_tokens"] and after["in_flight"] == 0


async def test_unknown_cached_tokens_count_as_unknown_with_a_warning(tmp_path: Path) -> None:
    async with sidecar(tmp_path, engine=StubEngine(cached_report=False)) as h:
        for _ in range(3):
            await h.chat("s1")
        state = await h.state()
        assert state["reuse"]["unknown_turns"] == 3 and state["reuse"]["known_turns"] == 0
        assert state["reuse"]["token_weighted"] is None and state["reuse"]["request_weighted"] is None
        assert any(
            "--enable-prompt-tokens-details" in w and "--enable-cache-report" in w for w in state["warnings"]
        )


async def test_unsessioned_requests_are_measured_count_in_demand_and_are_never_held(tmp_path: Path) -> None:
    async with sidecar(tmp_path, pool_tokens=100) as h:
        # the pool is tiny: a session would wait, an unsessioned request never does
        await h.chat("big", max_tokens=500)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: h.chat(None, headers={"x-stub-delay-ms": "200"}, max_tokens=50))
            await settle(lambda: h.cp.unsessioned_in_flight == 1, "unsessioned request in flight")
            demand_during = h.cp.budgeter.demand_tokens()
        assert demand_during > h.cp.budgeter.demand_tokens()
        state = await h.state()
        assert state["traffic"]["unsessioned_requests_total"] == 1
        assert state["traffic"]["unsessioned_turns_in_window"] == 1
        assert state["traffic"]["unsessioned_fraction"] == pytest.approx(0.5)
        assert state["backlog"]["held_requests"] == 0


async def test_session_end_header_and_delete(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        await h.chat("s1")
        await h.chat("s1", headers={"X-Session-End": "true"})
        sessions = (await h.client.get("/sessions")).json()
        [s1] = [s for s in sessions if s["id"] == "s1"]
        assert s1["state"] == "ended" and s1["end_reason"] == "client" and s1["turns"] == 2
        assert (await h.state())["backlog"]["total"] == 0
        await h.chat("s2")
        # issue 11 item 6: ending a session needs the operator token (or the client token, when one is set)
        r = await h.client.delete("/sessions/s2")
        assert r.status_code == 401 and (await h.client.get("/sessions/s2")).json()["state"] == "admitted"
        r = await h.client.delete("/sessions/s2", headers=OP_HEADERS)
        assert r.status_code == 200 and r.json()["session"]["state"] == "ended"
        assert (await h.client.delete("/sessions/s2", headers=OP_HEADERS)).status_code == 404
        assert (await h.client.delete("/sessions/never", headers=OP_HEADERS)).status_code == 404
        assert (await h.client.get("/sessions/never")).status_code == 404
        assert (await h.client.get("/sessions/s2")).json()["state"] == "ended"


async def test_idle_sessions_end_but_manual_parks_never_expire(tmp_path: Path) -> None:
    async with sidecar(tmp_path, idle_timeout_s=600) as h:
        await h.chat("idle")
        await h.chat("kept")
        assert (await h.client.post("/control/sessions/kept/park", headers=OP_HEADERS)).status_code == 200
        h.clock.advance(599)
        h.cp.tick()
        assert {s["id"] for s in (await h.client.get("/sessions?include_ended=false")).json()} == {
            "idle",
            "kept",
        }
        h.clock.advance(2)
        h.cp.tick()
        live = (await h.client.get("/sessions?include_ended=false")).json()
        assert [(s["id"], s["state"]) for s in live] == [("kept", "parked")]
        h.clock.advance(100_000)
        h.cp.tick()
        assert [s["id"] for s in (await h.client.get("/sessions?state=parked")).json()] == ["kept"]
        ended = (await h.client.get("/sessions?state=ended")).json()
        assert ended[0]["id"] == "idle" and ended[0]["end_reason"] == "idle"


async def test_subtrees_from_prefix_header_or_system_message(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        docs = "retrieved document text " * 40
        for i in range(4):
            await h.chat(f"s{i}", system=docs, content=f"q{i}")
        await h.chat("p", headers={"X-Prefix-Id": "rag-docs-7"})
        subtrees = {s["id"]: s for s in (await h.client.get("/subtrees")).json()}
        assert "rag-docs-7" in subtrees and subtrees["rag-docs-7"]["turns"] == 1
        [sys_tree] = [s for sid, s in subtrees.items() if sid.startswith("sys-") and s["turns"] == 4]
        assert sys_tree["recent_hits"] == 3 and sys_tree["warm"] is True
        assert sys_tree["cached_tokens"] > 0 and 0 < sys_tree["token_weighted"] < 1


async def test_body_limits_and_bad_bodies(tmp_path: Path) -> None:
    async with sidecar(tmp_path, max_body_bytes=2000, control_body_bytes=100) as h:
        r = await h.chat("s1", content="x" * 5000)
        assert r.status_code == 413 and r.json()["error"]["type"] == "body_too_large"
        r = await h.client.put(
            "/control/budgeter", headers=OP_HEADERS, content=b'{"mode": "off"' + b" " * 200 + b"}"
        )
        assert r.status_code == 413
        assert h.cp.budgeter.config.mode == "budgeter-park"
        json_type = {"Content-Type": "application/json"}  # other content types get 415 (issue 11 item 6)
        r = await h.client.post("/v1/chat/completions", content=b"{not json", headers=json_type)
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = await h.client.post("/v1/chat/completions", content=b"[1, 2]", headers=json_type)
        assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
        r = await h.chat("bad id with spaces")
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Session-Id"


async def test_metrics_are_prometheus_text(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async with sidecar(tmp_path, pool_tokens=50_000) as h:
        await h.chat("s1")
        await h.client.post("/compaction/requests", json={"subtrees": ["a"], "reason": "nightly"})
        text = (await h.client.get("/metrics")).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for name in (
            "reuse_token_weighted",
            "reuse_request_weighted",
            "reuse_divergence",
            "regime_thin_reuse",
            "demand_tokens",
            "pool_tokens",
            "band_low",
            "band_high",
            "sessions",
            "held_requests",
            "compaction_decisions",
            "mode",
            "requests",
        ):
            assert f"prefixops_sidecar_{name}" in families, name
        sessions = {s.labels["state"]: s.value for s in families["prefixops_sidecar_sessions"].samples}
        assert sessions == {"admitted": 1.0, "parked": 0.0, "waiting": 0.0}
        assert families["prefixops_sidecar_pool_tokens"].samples[0].value == 50_000
        decisions = [
            s for s in families["prefixops_sidecar_compaction_decisions"].samples if s.name.endswith("_total")
        ]
        assert decisions[0].labels == {"decision": "granted", "urgency": "normal"} and decisions[0].value == 1


@pytest.mark.parametrize("engine_transport", ["fast", "httpcore"])
async def test_both_engine_transports_proxy_streams_and_errors(tmp_path: Path, engine_transport: str) -> None:
    async with sidecar(tmp_path, engine_transport=engine_transport) as h:
        assert (await h.chat("s1")).json()["usage"]["prompt_tokens"] > 0
        events = sse_events((await h.chat("s1", stream=True)).text)
        assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])
        assert (await h.chat("s1", headers={"x-stub-status": "503"})).status_code == 503
        assert (await h.state())["reuse"]["turns"] == 2


async def test_other_v1_endpoints_pass_through_unmeasured(tmp_path: Path) -> None:
    async with sidecar(tmp_path) as h:
        r = await h.client.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer k"})
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}  # the stub's own answer
        assert h.engine.seen_headers == []  # the stub records completions only
        assert (await h.state())["reuse"]["turns"] == 0
