"""Fixtures for the sidecar tests: an in-process stub engine on a loopback port and the sidecar app.

The sidecar runs in-process (its ASGI app, lifespan included) behind httpx's ASGITransport,
with a hand-driven clock; the stub engine is a real HTTP server on 127.0.0.1 in the same
event loop. Tests that need real processes (SIGKILL, disconnects, the OpenAI client,
schemathesis) start them through tests.support.running.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar.app import create_app
from sidecar.control import ControlPlane
from sidecar.settings import Settings
from sidecar.store import Store
from tests.stubs.stub_engine import StubEngine, serve
from tests.support import FakeClock

OPERATOR = "operator-token-123"
VIEWER = "viewer-token-456"
OP_HEADERS = {"Authorization": f"Bearer {OPERATOR}", "X-Actor": "alice"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclasses.dataclass
class Harness:
    client: httpx.AsyncClient
    cp: ControlPlane
    clock: FakeClock
    engine: StubEngine
    settings: Settings

    async def chat(
        self,
        session: str | None = None,
        content: str = "hello",
        *,
        system: str = "You are terse.",
        max_tokens: int | None = 16,
        stream: bool = False,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> httpx.Response:
        body: dict[str, Any] = {
            "model": "stub-model",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": content}],
            **extra,
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if stream:
            body["stream"] = True
        h = dict(headers or {})
        if session is not None:
            h["X-Session-Id"] = session
        return await self.client.post("/v1/chat/completions", json=body, headers=h)

    async def state(self) -> dict[str, Any]:
        r = await self.client.get("/state", headers=OP_HEADERS)
        assert r.status_code == 200, r.text
        return r.json()


@contextlib.asynccontextmanager
async def sidecar(
    tmp_path: Path, *, engine: StubEngine | None = None, **overrides: Any
) -> AsyncIterator[Harness]:
    engine = engine or StubEngine()
    server = await serve(engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    values: dict[str, Any] = dict(
        engine=f"http://127.0.0.1:{port}",
        state_db=str(tmp_path / "sidecar.db"),
        operator_token=OPERATOR,
        tick_s=3600.0,
        pool_refresh_s=3600.0,
    )
    values.update(overrides)
    settings = Settings(**values)
    clock = FakeClock()
    app = create_app(settings, store=Store(settings.state_db), clock=clock)
    cp: ControlPlane = app.state.control
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
                # the pool fetch runs as a background task at start-up: let it finish
                for _ in range(200):
                    if cp.budgeter.pool_tokens is not None or cp.pool_error is not None:
                        break
                    await _sleep(0.01)
                yield Harness(client, cp, clock, engine, settings)
    finally:
        server.close()
        await server.wait_closed()


async def _sleep(seconds: float) -> None:
    import anyio

    await anyio.sleep(seconds)


async def settle(predicate: Any, what: str = "condition", attempts: int = 500) -> None:
    """Let the event loop run until predicate() holds (no wall-clock assertion: bounded by iterations)."""
    for _ in range(attempts):
        if predicate():
            return
        await _sleep(0.005)
    raise AssertionError(f"{what} never held")
