"""The connection to the engine: one httpx client, header filtering, error mapping, pool refresh."""

from __future__ import annotations

import logging
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .engine_transport import EngineTransport
from .errors import error_response
from .pool import fetch_pool_tokens
from .settings import Settings

log = logging.getLogger(__name__)

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailers",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"content-length",
    b"accept-encoding",
}  # X-Session-Id & co. go through: engines ignore them, session-affinity routers and the simulator use them
RESPONSE_DROP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "date",
    "server",
}


class EngineProxy:
    """Forwards requests to one engine. ``start()`` opens the client (in the app's lifespan)."""

    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.base = settings.engine.rstrip("/")
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self.on_error: list[Any] = []  # callbacks(message) for engine failures

    def start(self) -> None:
        s = self.settings
        timeout = httpx.Timeout(s.engine_timeout_s, connect=s.engine_connect_timeout_s)
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512, keepalive_expiry=30)
        transport = self._transport
        if transport is None and s.engine_transport == "fast":
            transport = EngineTransport()
        self._client = httpx.AsyncClient(
            timeout=timeout, limits=limits, transport=transport, follow_redirects=False
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    @property
    def client(self) -> httpx.AsyncClient:
        assert self._client is not None, "EngineProxy.start() was not called"
        return self._client

    @staticmethod
    def forward_headers(request: Request) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in request.headers.raw if k not in HOP_BY_HOP]
        headers.append((b"accept-encoding", b"identity"))
        return headers

    @staticmethod
    def response_headers(response: httpx.Response) -> dict[str, str]:
        return {k: v for k, v in response.headers.items() if k.lower() not in RESPONSE_DROP}

    def failed(self, message: str) -> None:
        log.warning("%s", message)
        for callback in self.on_error:
            callback(message)

    def error(self, exc: httpx.HTTPError) -> JSONResponse:
        """The OpenAI-shaped 502/504 for a failed engine call (and the failure recorded)."""
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            status, kind = 504, "engine_timeout"
            message = f"engine {self.base} did not answer in time ({type(exc).__name__})"
        else:
            status, kind = 502, "engine_unavailable"
            message = f"engine {self.base} unreachable: {type(exc).__name__}: {exc}"
        self.failed(message)
        return error_response(status, kind, message)

    def relay(self, response: httpx.Response) -> Response:
        return Response(
            content=response.content,
            status_code=response.status_code,
            headers=self.response_headers(response),
        )

    async def post(self, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> httpx.Response:
        return await self.client.post(self.base + path, content=body, headers=headers)

    async def open_stream(self, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> httpx.Response:
        return await self.client.send(
            self.client.build_request("POST", self.base + path, content=body, headers=headers), stream=True
        )

    async def forward(self, request: Request, path_and_query: str, body: bytes) -> Response:
        """Forward any other request unmeasured (model list, embeddings, tokenize, ...)."""
        try:
            response = await self.client.request(
                request.method,
                self.base + path_and_query,
                content=body,
                headers=self.forward_headers(request),
            )
        except httpx.HTTPError as exc:
            return self.error(exc)
        return self.relay(response)

    async def pool_tokens(self) -> tuple[int | None, str | None, str | None]:
        return await fetch_pool_tokens(self.client, self.base)

    async def context_length(self) -> int | None:
        """The engine's context length (the largest ``max_model_len`` in ``/v1/models``), None when unknown."""
        try:
            response = await self.client.get(self.base + "/v1/models", timeout=5.0)
            models = response.json().get("data") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError, RecursionError):
            return None
        lengths = [m.get("max_model_len") for m in models or () if isinstance(m, dict)]
        valid = [n for n in lengths if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 2**40]
        return max(valid) if valid else None
