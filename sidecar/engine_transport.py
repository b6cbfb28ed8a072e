"""A lean HTTP/1.1 keep-alive transport for ``httpx.AsyncClient`` -> engine traffic.

Why: with httpx's default transport (httpcore over anyio) the sidecar spent about 1 ms of
CPU per proxied request, and httpcore's pool walks every pooled connection (with a
``poll`` syscall each) on every request, so the cost grows with concurrency. This
transport keeps idle connections per origin on a LIFO stack (O(1) to take and give
back), writes each request in one ``write`` and parses responses with a few
``readuntil`` calls on asyncio streams. The sidecar still talks to the engine through
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


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, transport: EngineTransport, conn: _Conn, origin: Origin, framing: str, length: int,
                 keep_alive: bool, read_timeout: float | None, request: httpx.Request) -> None:
        self.transport = transport
        self.conn = conn
        self.origin = origin
        self.framing = framing
        self.length = length
        self.keep_alive = keep_alive
        self.read_timeout = read_timeout
        self.request = request
        self.complete = framing == "none"
        self.released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader = self.conn.reader
        try:
            if self.framing == "length":
                remaining = self.length
                while remaining > 0:
                    async with _timeout(self.read_timeout):
                        data = await reader.read(min(remaining, 1 << 20))
                    if not data:
                        raise httpx.RemoteProtocolError(
                            "engine closed the connection before the response body was complete",
                            request=self.request)
                    remaining -= len(data)
                    yield data
            elif self.framing == "chunked":
                while True:
                    async with _timeout(self.read_timeout):
                        line = await reader.readuntil(b"\r\n")
                        size = int(line.split(b";", 1)[0].strip(), 16)
                        if size == 0:
                            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                                pass  # trailers
                            break
                        data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif self.framing == "eof":
                while True:
                    async with _timeout(self.read_timeout):
                        data = await reader.read(1 << 20)
                    if not data:
                        break
                    yield data
            self.complete = True
        except TimeoutError:
            raise httpx.ReadTimeout("engine did not send the response body in time", request=self.request) from None
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError) as exc:
            raise httpx.RemoteProtocolError(f"engine response body broke off: {type(exc).__name__}: {exc}",
                                            request=self.request) from None

    async def aclose(self) -> None:
        if self.released:
            return
        self.released = True
        if self.complete and self.keep_alive and self.framing != "eof":
            self.transport._release(self.origin, self.conn)
        else:
            self.conn.close()


class EngineTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_idle_per_origin: int = 512, keepalive_expiry: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
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

    async def _acquire(self, origin: Origin, timeout: float | None, request: httpx.Request) -> tuple[_Conn, bool]:
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

        for attempt in (0, 1):
            conn, reused = await self._acquire(origin, connect_timeout, request)
            try:
                conn.writer.write(payload)
                async with _timeout(read_timeout):
                    head = await conn.reader.readuntil(b"\r\n\r\n")
                    while head[9:10] == b"1" and head[9:12] != b"101":  # 1xx informational: skip
                        head = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                conn.close()
                if reused and attempt == 0 and not exc.partial:
                    continue  # the engine closed this idle keep-alive connection: once more on a fresh one
                raise httpx.RemoteProtocolError("engine closed the connection without a response",
                                                request=request) from None
            except (ConnectionResetError, BrokenPipeError) as exc:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from None
            except TimeoutError:
                conn.close()
                raise httpx.ReadTimeout("engine did not answer in time", request=request) from None
            except (asyncio.LimitOverrunError, OSError) as exc:
                conn.close()
                raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from None
            break
        else:  # pragma: no cover - the loop always breaks or raises
            raise httpx.ReadError("no response", request=request)

        head_lines = head[:-4].split(b"\r\n")
        status_line = head_lines[0].split(b" ", 2)
        try:
            status = int(status_line[1])
        except (IndexError, ValueError):
            conn.close()
            raise httpx.RemoteProtocolError(f"malformed status line {head_lines[0][:80]!r}",
                                            request=request) from None
        reason = status_line[2] if len(status_line) > 2 else b""
        headers: list[tuple[bytes, bytes]] = []
        framing, length, keep_alive = "eof", 0, True
        for line in head_lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip()
            value = value.strip()
            headers.append((name, value))
            lower = name.lower()
            if lower == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    conn.close()
                    raise httpx.RemoteProtocolError(f"bad content-length {value!r}", request=request) from None
                if framing != "chunked":
                    framing = "length"
            elif lower == b"transfer-encoding" and b"chunked" in value.lower():
                framing = "chunked"
            elif lower == b"connection" and value.lower() == b"close":
                keep_alive = False
        if request.method == "HEAD" or status in (204, 304) or (framing == "length" and length == 0):
            framing = "none"
        stream = _ResponseStream(self, conn, origin, framing, length, keep_alive, read_timeout, request)
        if framing == "none":
            await stream.aclose()
        return httpx.Response(status, headers=headers, stream=stream,
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason})

    async def aclose(self) -> None:
        for stack in self._idle.values():
            for conn in stack:
                conn.close()
        self._idle.clear()
