"""The sidecar's FastAPI app: wiring only. The error shape is documented in sidecar/errors.py;
the routes live in routes_traffic.py, routes_read.py and routes_control.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from . import errors, routes_control, routes_read, routes_traffic
from .auth import Auth
from .context import Sidecar
from .control import ControlPlane
from .control_state import Refused
from .engine_proxy import EngineProxy
from .metrics import SidecarCollector
from .middleware import Guard
from .settings import Settings
from .store import Store

log = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Callable[[], float] = time.time,
    body_deadline: bool = True,
) -> FastAPI:
    """The sidecar app. ``store`` defaults to the SQLite db at ``settings.state_db``; ``transport`` and
    ``clock`` are test seams. ``body_deadline=False`` when the server already bounds request reads
    (sidecar.server's protocol): proxied bodies then cost no timer per read."""
    if store is None:
        store = Store(settings.state_db)
    cp = ControlPlane(settings, store, clock)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SidecarCollector(cp))
    engine = EngineProxy(settings, transport)
    engine.on_error.append(cp.engine_failed)
    sc = Sidecar(settings=settings, cp=cp, store=store, engine=engine, auth=Auth(settings), registry=registry)

    async def pool_loop() -> None:
        while True:
            tokens, kind, error = await engine.pool_tokens()
            if error:
                log.warning("%s", error)
            cp.set_pool(tokens, kind, error)
            cp.set_context_length(await engine.context_length())
            await asyncio.sleep(settings.pool_refresh_s)

    async def tick_loop() -> None:
        while True:
            await asyncio.sleep(settings.tick_s)
            try:
                cp.tick()
            except Exception:  # a bug here must not stop holding and releasing
                log.exception("periodic tick failed")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        if not settings.operator_token:
            log.warning("PREFIXOPS_OPERATOR_TOKEN is not set: the control API is read-only")
        if settings.viewer_token:
            log.info("read endpoints need the viewer (or operator) token")
        background = [asyncio.create_task(pool_loop()), asyncio.create_task(tick_loop())]
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            cp.persist(force=True)
            cp.flush_turns()
            await engine.close()
            store.close()

    app = FastAPI(
        title="PrefixOps sidecar",
        version="1.0",
        description="Session-aware OpenAI-compatible proxy: reuse measurement, KV budgeter, compaction gate.",
        lifespan=lifespan,
    )
    app.state.control = cp
    app.state.sidecar = sc
    app.add_middleware(
        Guard,
        max_bytes=settings.max_body_bytes,
        control_bytes=settings.control_body_bytes,
        allowed_hosts=settings.hosts(),
        read_timeout_s=settings.read_timeout_s,
        proxied_deadline=body_deadline,
    )
    errors.install(app)

    async def refused(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Refused)
        return errors.error_response(exc.status, exc.kind, str(exc), field=exc.field)

    app.add_exception_handler(Refused, refused)
    app.include_router(routes_traffic.router(sc))
    app.include_router(routes_read.router(sc))
    app.include_router(routes_control.router(sc))
    return app
