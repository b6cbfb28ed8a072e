"""The sidecar as a real process: SIGKILL and restart, held clients going away, the OpenAI client end to end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from core.engine_metrics import pool_tokens
from tests.support import PYTHON, free_port, running, wait_for

OPERATOR = "operator-token-process"
OP = {"Authorization": f"Bearer {OPERATOR}", "X-Actor": "carol"}


@contextlib.contextmanager
def stub_engine(*extra: str) -> Iterator[str]:
    port = free_port()
    with running(
        [PYTHON, "-m", "tests.stubs.stub_engine", "--port", str(port), *extra],
        name="stub-engine",
        ready_url=f"http://127.0.0.1:{port}/v1/models",
    ):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def simulator() -> Iterator[str]:
    port = free_port()
    with running(
        [PYTHON, "-m", "simulator", "serve", "--port", str(port)],
        name="simulator",
        ready_url=f"http://127.0.0.1:{port}/v1/models",
    ):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def sidecar_process(
    engine: str, db: Path, *extra: str, port: int | None = None, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = port or free_port()
    cmd = [PYTHON, "-m", "sidecar", "--engine", engine, "--port", str(port), "--state-db", str(db), *extra]
    with running(
        cmd,
        name="sidecar",
        ready_url=f"http://127.0.0.1:{port}/healthz",
        env={"PREFIXOPS_OPERATOR_TOKEN": OPERATOR, "PREFIXOPS_VIEWER_TOKEN": "", **(env or {})},
    ) as proc:
        yield f"http://127.0.0.1:{port}", proc


def chat(
    base: str, session: str, content: str = "hello", timeout: float = 30.0, **extra: Any
) -> httpx.Response:
    body = {
        "model": "stub-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 100,
        **extra,
    }
    return httpx.post(
        f"{base}/v1/chat/completions", json=body, headers={"X-Session-Id": session}, timeout=timeout
    )


def snapshot_sessions(db: Path) -> dict[str, Any]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT doc FROM sessions").fetchall()
    finally:
        con.close()
    return {s["id"]: s for s in (json.loads(doc) for (doc,) in rows)}


def test_sigkill_mid_session_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "sidecar.db"
    with stub_engine() as engine:
        port = free_port()
        with sidecar_process(engine, db, "--pool-tokens", "100000", port=port) as (base, proc):
            for session in ("a", "b", "c"):
                assert chat(base, session).status_code == 200
            assert (
                httpx.put(
                    f"{base}/control/budgeter",
                    headers=OP,
                    json={"mode": "session-cap-park", "low": 0.6, "high": 0.9},
                ).status_code
                == 200
            )
            assert httpx.post(f"{base}/control/sessions/b/park", headers=OP).status_code == 200
            assert (
                httpx.post(f"{base}/control/sessions/c/unpark", headers=OP, json={"pin": True}).status_code
                == 200
            )
            assert (
                httpx.post(
                    f"{base}/control/compaction/defer",
                    headers=OP,
                    json={"minutes": 30, "reason": "maintenance"},
                ).status_code
                == 200
            )
            # a turn after the last control action: its context reaches the db by the periodic snapshot only
            assert chat(base, "a", "a much longer second turn " * 20).status_code == 200
            wait_for(
                lambda: snapshot_sessions(db).get("a", {}).get("turns") == 2,
                30,
                "session a's turn persisted",
                interval=0.05,
            )
            before_state = httpx.get(f"{base}/state").json()
            before_sessions = {s["id"]: s for s in httpx.get(f"{base}/sessions").json()}
            before_audit = httpx.get(f"{base}/audit").json()
            # b is parked: its next turn is held when the sidecar dies
            with httpx.Client(timeout=30) as client, pytest.raises(httpx.HTTPError):

                def kill_when_held() -> None:
                    wait_for(
                        lambda: httpx.get(f"{base}/state").json()["backlog"]["held_requests"] == 1,
                        30,
                        "b held",
                        interval=0.05,
                    )
                    os.killpg(proc.pid, signal.SIGKILL)

                killer = threading.Thread(target=kill_when_held)
                killer.start()
                try:
                    client.post(
                        f"{base}/v1/chat/completions",
                        headers={"X-Session-Id": "b"},
                        json={"model": "stub-model", "messages": [{"role": "user", "content": "b2"}]},
                    )
                finally:
                    killer.join()
            proc.wait(timeout=10)
            assert proc.returncode == -signal.SIGKILL

        with sidecar_process(engine, db, "--pool-tokens", "100000", port=port) as (base, _):
            state = httpx.get(f"{base}/state").json()
            assert state["restored"] is True
            for key in ("mode", "low", "high", "demand_tokens"):
                assert state["budgeter"][key] == before_state["budgeter"][key], key
            assert (state["budgeter"]["mode"], state["budgeter"]["low"], state["budgeter"]["high"]) == (
                "session-cap-park",
                0.6,
                0.9,
            )
            assert state["compaction"]["deferred_until"] == before_state["compaction"]["deferred_until"]
            assert state["compaction"]["deferred_reason"] == "maintenance"
            after = {s["id"]: s for s in httpx.get(f"{base}/sessions").json()}
            for sid in ("a", "b", "c"):
                for key in ("state", "context_tokens", "turns", "manual", "pinned", "parked_since"):
                    assert after[sid][key] == before_sessions[sid][key], (sid, key)
            assert after["a"]["turns"] == 2 and after["b"]["state"] == "parked" and after["b"]["manual"]
            assert after["c"]["pinned"] is True
            assert httpx.get(f"{base}/audit").json() == before_audit
            # the manual park still holds b's next turn until an operator unparks it
            with httpx.Client(timeout=30) as client:
                result: dict[str, int] = {}
                t = threading.Thread(
                    target=lambda: result.setdefault(
                        "status",
                        client.post(
                            f"{base}/v1/chat/completions",
                            headers={"X-Session-Id": "b"},
                            json={"model": "stub-model", "messages": [{"role": "user", "content": "b3"}]},
                        ).status_code,
                    )
                )
                t.start()
                wait_for(
                    lambda: httpx.get(f"{base}/state").json()["backlog"]["held_requests"] == 1,
                    30,
                    "b held again",
                    interval=0.05,
                )
                assert "status" not in result
                assert httpx.post(f"{base}/control/sessions/b/unpark", headers=OP).status_code == 200
                t.join(timeout=30)
            assert result == {"status": 200}
            audit = httpx.get(f"{base}/audit?after_id={before_audit[-1]['id']}").json()
            assert [a["action"] for a in audit] == ["session.unpark"] and audit[0]["actor"] == "carol"


def test_a_held_client_that_disconnects_keeps_its_place(tmp_path: Path) -> None:
    with (
        stub_engine() as engine,
        sidecar_process(engine, tmp_path / "s.db", "--pool-tokens", "100000") as (base, _),
    ):
        assert chat(base, "p").status_code == 200
        assert httpx.post(f"{base}/control/sessions/p/park", headers=OP).status_code == 200
        parked_since = httpx.get(f"{base}/sessions/p").json()["parked_since"]
        with pytest.raises(httpx.ReadTimeout):
            chat(base, "p", timeout=0.5)
        wait_for(
            lambda: httpx.get(f"{base}/state").json()["backlog"]["held_requests"] == 0,
            30,
            "hold dropped",
            interval=0.05,
        )
        p = httpx.get(f"{base}/sessions/p").json()
        assert (
            p["state"] == "parked" and p["manual"] and p["parked_since"] == parked_since and p["turns"] == 1
        )
        metrics = httpx.get(f"{base}/metrics").text
        assert "prefixops_sidecar_hold_disconnects_total 1.0" in metrics
        r = httpx.post(f"{base}/control/sessions/p/unpark", headers=OP)
        assert r.json()["session"]["in_flight"] == 0  # nothing was forwarded for the client that left
        assert chat(base, "p").status_code == 200


def test_binds_loopback_and_refuses_bad_flags(tmp_path: Path) -> None:
    bad = subprocess.run(
        [PYTHON, "-m", "sidecar", "--engine", "ftp://x", "--state-db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--engine must be an http(s) URL" in bad.stderr
    assert "Traceback" not in bad.stderr
    with stub_engine() as engine, sidecar_process(engine, tmp_path / "s.db") as (base, _):
        port = int(base.rsplit(":", 1)[1])
        listening = []
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:
                listening.append(address)
        assert listening == ["0100007F"]  # 127.0.0.1 only
        assert httpx.get(f"{base}/healthz").json()["read_only"] is False


@pytest.mark.parametrize("engine_kind", ["simulator", "stub"])
def test_openai_client_end_to_end(tmp_path: Path, engine_kind: str) -> None:
    """The official OpenAI Python client through the sidecar, streaming and not, as users drive it."""
    engine_cm = simulator() if engine_kind == "simulator" else stub_engine()
    with engine_cm as engine, sidecar_process(engine, tmp_path / "s.db") as (base, _):
        client = openai.OpenAI(
            base_url=f"{base}/v1",
            api_key="sk-client-secret",
            max_retries=0,
            default_headers={"X-Session-Id": "e2e"},
        )
        model = client.models.list().data[0].id
        system = {"role": "system", "content": "You are a concise assistant for the operations team. " * 10}
        messages: list[Any] = [system, {"role": "user", "content": "first question"}]
        first = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
        assert first.object == "chat.completion" and first.choices[0].message.role == "assistant"
        assert first.usage is not None and first.usage.prompt_tokens > 0
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "second question"},
        ]
        chunks = list(
            client.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True)
        )
        assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
        assert all(c.usage is None for c in chunks)  # never asked for usage: never sees it
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "third"}]
        with_usage = list(
            client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        final = with_usage[-1]
        assert final.choices == [] and final.usage is not None
        assert (
            final.usage.prompt_tokens_details is not None
            and final.usage.prompt_tokens_details.cached_tokens > 0
        )
        completion = client.completions.create(model=model, prompt="Once upon a time " * 20, max_tokens=5)
        assert completion.object == "text_completion" and completion.choices[0].text is not None
        streamed = list(
            client.completions.create(model=model, prompt="Once upon a time " * 20, max_tokens=5, stream=True)
        )
        assert streamed and all(c.usage is None for c in streamed)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
        state = httpx.get(f"{base}/state").json()
        assert state["reuse"]["turns"] == 5 and state["reuse"]["unknown_turns"] == 0
        assert state["reuse"]["token_weighted"] > 0
        [session] = [s for s in httpx.get(f"{base}/sessions").json() if s["id"] == "e2e"]
        assert session["turns"] == 5 and session["failed_turns"] == 1
        engine_pool = pool_tokens(httpx.get(f"{engine}/metrics").text)
        assert engine_pool and state["budgeter"]["pool_tokens"] == engine_pool
        assert state["budgeter"]["pool_source"] == "engine"


def test_a_streaming_client_that_goes_away_midway_fails_only_its_turn(tmp_path: Path) -> None:
    with (
        stub_engine("--completion-tokens", "50") as engine,
        sidecar_process(engine, tmp_path / "s.db", "--pool-tokens", "100000") as (base, _),
    ):
        assert chat(base, "s").status_code == 200
        before = httpx.get(f"{base}/sessions/s").json()
        body = {
            "model": "stub-model",
            "messages": [{"role": "user", "content": "long answer"}],
            "stream": True,
        }
        with (
            httpx.Client(timeout=30) as client,
            client.stream(
                "POST",
                f"{base}/v1/chat/completions",
                json=body,
                headers={"X-Session-Id": "s", "x-stub-chunk-delay-ms": "50"},
            ) as r,
        ):
            first = next(r.iter_lines())
            assert first.startswith("data: ")
        # the client closed the stream after one event
        wait_for(
            lambda: httpx.get(f"{base}/sessions/s").json()["in_flight"] == 0,
            30,
            "turn given back",
            interval=0.05,
        )
        after = httpx.get(f"{base}/sessions/s").json()
        assert after["failed_turns"] == 1 and after["turns"] == before["turns"]
        assert after["context_tokens"] == before["context_tokens"]
        assert httpx.get(f"{base}/state").json()["traffic"]["in_flight"] == 0
        assert chat(base, "s").status_code == 200  # the session carries on
