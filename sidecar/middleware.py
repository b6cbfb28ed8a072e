"""Pure ASGI middleware of the sidecar, in one pass per request:

1. Host check: a Host header not in ``--allowed-hosts`` gets 421 (DNS rebinding).
2. Content type: a request with a body must say ``application/json`` (or ``+json``), else 415;
   a browser's cross-site form post (``text/plain``, form encoded) never reaches a route.
3. Body limit and read deadline: bodies over ``--max-body-bytes`` (``/v1/*``) or 64 KiB (everything
   else) get 413, a body not received within ``--read-timeout`` gets 408 (under ``python -m sidecar``
   the server's protocol closes such connections instead, so proxied reads cost no timer). Control bodies are read
   whole here, so a chunked oversize body gets the documented 413, not a parse error.
"""

from __future__ import annotations

import math
import time

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, error_response

BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def host_of(scope: Scope) -> str | None:
    name: bytes
    value: bytes
    for name, value in scope["headers"]:
        if name == b"host":
            host: str = value.decode("latin-1").strip().lower()
            if host.startswith("["):
                return host[: host.find("]") + 1] if "]" in host else host
            return host.rsplit(":", 1)[0] if ":" in host else host
    return None


def is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        control_bytes: int,
        allowed_hosts: frozenset[str],
        read_timeout_s: float = math.inf,
        proxied_deadline: bool = True,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.control_bytes = control_bytes
        self.allowed_hosts = allowed_hosts
        self.read_timeout_s = read_timeout_s
        self.proxied_deadline = proxied_deadline  # False when the server bounds reads (no timer per read)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.allowed_hosts:
            host = host_of(scope)
            if host not in self.allowed_hosts:
                await error_response(
                    421,
                    "misdirected_request",
                    f"Host {host!r} is not served here; allowed: "
                    f"{', '.join(sorted(self.allowed_hosts))} (see --allowed-hosts)",
                    field="Host",
                )(scope, receive, send)
                return
        if scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        proxied = scope["path"].startswith("/v1/")
        limit = self.max_bytes if proxied else self.control_bytes
        declared: int | None = None
        content_type: bytes | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
            elif name == b"content-type":
                content_type = value
            elif name == b"transfer-encoding":
                chunked = True
        if declared is not None and (declared > limit or declared < 0):
            await error_response(
                413 if declared > limit else 400,
                "body_too_large" if declared > limit else "invalid_request",
                f"request body of {declared if declared >= 0 else 'invalid'} bytes; "
                f"the limit is {limit} bytes",
                field="body",
            )(scope, receive, send)
            return
        has_body = chunked or (declared is not None and declared > 0)
        if has_body and (content_type is None or not is_json(content_type)):
            shown = "none" if content_type is None else repr(content_type.decode("latin-1")[:100])
            await error_response(
                415,
                "unsupported_media_type",
                f"request bodies must be application/json, got content type {shown}",
                field="Content-Type",
            )(scope, receive, send)
            return
        deadline = time.monotonic() + self.read_timeout_s
        if not proxied:
            await self._buffered(scope, receive, send, limit, deadline)
            return
        received = 0

        bounded = self.proxied_deadline

        async def limited_receive() -> Message:
            nonlocal received, bounded
            if bounded:
                try:
                    with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                        message = await receive()
                except TimeoutError:
                    raise ApiError(
                        408,
                        "request_timeout",
                        f"request body not received within {self.read_timeout_s:g} s (--read-timeout)",
                        field="body",
                    ) from None
            else:
                message = await receive()
            if message["type"] == "http.request":
                if not message.get("more_body", False):
                    bounded = False  # the body is in: later reads wait for a disconnect, unbounded
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(
                        413,
                        "body_too_large",
                        f"request body exceeds the limit of {limit} bytes",
                        field="body",
                    )
            return message

        await self.app(scope, limited_receive, send)

    async def _buffered(
        self, scope: Scope, receive: Receive, send: Send, limit: int, deadline: float
    ) -> None:
        chunks: list[bytes] = []
        size = 0
        more = True
        try:
            with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                while more:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # the client went away
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        await error_response(
                            413,
                            "body_too_large",
                            f"request body exceeds the limit of {limit} bytes",
                            field="body",
                        )(scope, receive, send)
                        return
                    chunks.append(chunk)
                    more = message.get("more_body", False)
        except TimeoutError:
            await error_response(
                408,
                "request_timeout",
                f"request body not received within {self.read_timeout_s:g} s (--read-timeout)",
                field="body",
            )(scope, receive, send)
            return
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


BodyLimit = Guard  # the name of this middleware before it also checked hosts and content types
