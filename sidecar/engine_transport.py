"""A lean HTTP/1.1 keep-alive transport for ``httpx.AsyncClient`` -> engine traffic.

Why: with httpx's default transport (httpcore over anyio) the sidecar spent about 1 ms of
CPU per proxied request, and httpcore's pool walks every pooled connection (with a
``poll`` syscall each) on every request, so the cost grows with concurrency. This
transport keeps idle connections per origin on a LIFO stack (O(1) to take and give
back), writes each request in one ``write`` and parses responses with
``httptools.HttpResponseParser`` (llhttp, as uvicorn does): status line, headers, 1xx
responses, Content-Length/chunked/close-delimited bodies and the keep-alive decision are
llhttp's; response bodies are handed on piece by piece as they arrive (SSE is not buffered). The sidecar still talks to the engine through
one shared ``httpx.AsyncClient`` (``client.send(..., stream=True)`` for streams);
``--engine-transport httpcore`` switches back to httpx's default transport.

Errors are httpx's: ``ConnectError``/``ConnectTimeout`` when the engine cannot be
reached, ``ReadTimeout``/``WriteTimeout``, and ``RemoteProtocolError`` when the engine
closes a connection mid-message. A request sent on a reused keep-alive connection
that the engine had already closed (no response byte received) is retried once on a
fresh connection, as browsers and httpcore do.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator

import httptools
import httpx

_NO_TIMEOUT = contextlib.nullcontext()


def _timeout(seconds: float | None) -> contextlib.AbstractAsyncContextManager[object]:
    if seconds is None:
        return _NO_TIMEOUT
    return asyncio.timeout(seconds)


class _Conn:
    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float, expiry: float) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing() or now - self.idle_since > expiry)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


Origin = tuple[str, str, int]


class _Parse:
    """Callbacks for one ``httptools.HttpResponseParser`` (llhttp): one parser per response."""

    __slots__ = ("parser", "head_only", "reason", "headers", "head_done", "done", "keep_alive", "raw", "body")

    def __init__(self, head_only: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.head_only = head_only  # response to HEAD: llhttp cannot be told, so the body is skipped here
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False  # the final (non-1xx) response head has been parsed
        self.done = False  # the final response is complete
        self.keep_alive = False
        self.raw = False  # 101 Switching Protocols: the rest of the connection is passed through as the body
        self.body: list[bytes] = []  # body pieces parsed but not yet yielded

    def on_message_begin(self) -> None:
        if self.done:  # bytes after the complete response: never reuse this connection
            self.keep_alive = False
        else:  # first message, or the final one after a 1xx informational response
            self.reason = b""
            self.headers = []

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            return  # 1xx informational: llhttp completes it without a body; the final head follows
        self.head_done = True
        if self.head_only:
            self.done = True
            self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, data: bytes) -> None:
        if self.done:  # a body after a HEAD response: the connection is out of step
            self.keep_alive = False
        else:
            self.body.append(data)

    def on_message_complete(self) -> None:
        if self.head_done and not self.done:
            self.done = True
            self.keep_alive = self.parser.should_keep_alive()

    def feed(self, data: bytes) -> None:
        """Parse ``data``; raises ``httptools.HttpParserError`` on a malformed response."""
        if self.raw:
            self.body.append(data)
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self.raw, self.done, self.keep_alive = True, False, False
            rest = data[exc.args[0] :]
            if rest:
                self.body.append(rest)

    def eof(self) -> bool:
        """The engine closed the connection: True if that ends the response (close-delimited body)."""
        if self.done:
            return True
        if not self.head_done:
            return False
        if self.raw:
            self.done = True
            return True
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
                return False  # framed body cut short
        self.done, self.keep_alive = True, False
        return True


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(
        self,
        transport: EngineTransport,
        conn: _Conn | None,
        origin: Origin,
        parse: _Parse,
        read_timeout: float | None,
        request: httpx.Request,
    ) -> None:
        self.transport = transport
        self.conn = conn  # None once given back (the whole response arrived with its head)
        self.origin = origin
        self.parse = parse
        self.read_timeout = read_timeout
        self.request = request
        self.released = conn is None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        parse = self.parse
        try:
            while True:
                if parse.body:
                    pieces, parse.body = parse.body, []
                    for piece in pieces:
                        yield piece
                if parse.done or self.conn is None:
                    return
                async with _timeout(self.read_timeout):
                    data = await self.conn.reader.read(1 << 20)
                if data:
                    parse.feed(data)
                elif not parse.eof():
                    raise httpx.RemoteProtocolError(
                        "engine closed the connection before the response body was complete",
                        request=self.request,
                    )
        except TimeoutError:
            raise httpx.ReadTimeout(
                "engine did not send the response body in time", request=self.request
            ) from None
        except (httptools.HttpParserError, ConnectionError) as exc:
            raise httpx.RemoteProtocolError(
                f"engine response body broke off: {type(exc).__name__}: {exc}", request=self.request
            ) from None

    async def aclose(self) -> None:
        if self.released:
            return
        self.released = True
        conn = self.conn
        assert conn is not None
        if self.parse.done and self.parse.keep_alive:
            self.transport._release(self.origin, conn)
        else:
            conn.close()


class EngineTransport(httpx.AsyncBaseTransport):
    def __init__(
        self,
        max_idle_per_origin: int = 512,
        keepalive_expiry: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.max_idle = max_idle_per_origin
        self.keepalive_expiry = keepalive_expiry
        self.ssl_context = ssl_context
        self._idle: dict[Origin, list[_Conn]] = {}
        self.connections_opened = 0

    def _release(self, origin: Origin, conn: _Conn) -> None:
        stack = self._idle.setdefault(origin, [])
        if len(stack) >= self.max_idle or conn.writer.is_closing():
            conn.close()
            return
        conn.idle_since = time.monotonic()
        stack.append(conn)

    async def _connect(self, origin: Origin, timeout: float | None, request: httpx.Request) -> _Conn:
        scheme, host, port = origin
        ssl_ctx = None
        if scheme == "https":
            ssl_ctx = self.ssl_context or ssl.create_default_context()
        try:
            async with _timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, ssl=ssl_ctx, limit=1 << 24)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"{exc}", request=request) from None
        self.connections_opened += 1
        return _Conn(reader, writer)

    async def _acquire(
        self, origin: Origin, timeout: float | None, request: httpx.Request
    ) -> tuple[_Conn, bool]:
        stack = self._idle.get(origin)
        now = time.monotonic()
        while stack:
            conn = stack.pop()
            if conn.usable(now, self.keepalive_expiry):
                return conn, True
            conn.close()
        return await self._connect(origin, timeout, request), False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {scheme!r}", request=request)
        origin: Origin = (scheme, url.host, url.port or (443 if scheme == "https" else 80))
        timeouts = request.extensions.get("timeout", {})
        connect_timeout = timeouts.get("connect")
        read_timeout = timeouts.get("read")
        body = await request.aread()
        lines = [b"%s %s HTTP/1.1" % (request.method.encode(), url.raw_path)]
        lines.extend(b"%s: %s" % (k, v) for k, v in request.headers.raw)
        payload = b"\r\n".join(lines) + b"\r\n\r\n" + body

        head_only = request.method == "HEAD"
        for attempt in (0, 1):
            conn, reused = await self._acquire(origin, connect_timeout, request)
            parse = _Parse(head_only)
            received = 0
            try:
                conn.writer.write(payload)
                async with _timeout(read_timeout):
                    while not parse.head_done:
                        data = await conn.reader.read(1 << 20)
                        if not data:
                            break
                        received += len(data)
                        parse.feed(data)
            except (ConnectionResetError, BrokenPipeError) as exc:
                conn.close()
                if reused and attempt == 0 and not received:
                    continue  # the engine closed this idle keep-alive connection: once more on a fresh one
                raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from None
            except TimeoutError:
                conn.close()
                raise httpx.ReadTimeout("engine did not answer in time", request=request) from None
            except httptools.HttpParserError as exc:
                conn.close()
                raise httpx.RemoteProtocolError(
                    f"malformed response head: {type(exc).__name__}: {exc}", request=request
                ) from None
            except OSError as exc:
                conn.close()
                raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from None
            if not parse.head_done:  # EOF before the response head was complete
                conn.close()
                if reused and attempt == 0 and not received:
                    continue  # the engine closed this idle keep-alive connection: once more on a fresh one
                raise httpx.RemoteProtocolError(
                    "engine closed the connection without a response", request=request
                )
            break
        else:  # pragma: no cover - the loop always breaks or raises
            raise httpx.ReadError("no response", request=request)

        stream = _ResponseStream(self, conn, origin, parse, read_timeout, request)
        if parse.done:  # the whole response came with its head (or has no body): give the connection back now
            await stream.aclose()
            stream.conn = None
        return httpx.Response(
            parse.parser.get_status_code(),
            headers=parse.headers,
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": parse.reason},
        )

    async def aclose(self) -> None:
        for stack in self._idle.values():
            for conn in stack:
                conn.close()
        self._idle.clear()
