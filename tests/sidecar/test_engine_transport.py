"""sidecar/engine_transport.py against scripted raw HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from sidecar.engine_transport import EngineTransport
from tests.support import free_port

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            await handler(reader, writer, len(connections))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        srv.close()
        await srv.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


async def keep_alive_json(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while True:
        head, body = await read_request(reader)
        answer = b'{"echo": %d}' % len(body)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(answer), answer)
        )
        await writer.drain()


async def test_content_length_responses_reuse_one_connection() -> None:
    transport = EngineTransport()
    async with server(keep_alive_json) as (url, conns), httpx.AsyncClient(transport=transport) as client:
        for i in range(5):
            r = await client.post(url + "/v1/x", content=b"a" * i, headers={"authorization": "Bearer k"})
            assert r.status_code == 200 and r.json() == {"echo": i}
            assert r.headers["content-type"] == "application/json"
        assert len(conns) == 1 and transport.connections_opened == 1


async def test_chunked_streaming_yields_chunks_as_they_arrive() -> None:
    release = asyncio.Event()

    async def sse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        writer.write(b"d\r\ndata: first\n\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"e\r\ndata: second\n\n\r\n0\r\n\r\n")
        await writer.drain()
        await keep_alive_json(reader, writer, n)

    transport = EngineTransport()
    async with server(sse) as (url, conns), httpx.AsyncClient(transport=transport) as client:
        async with client.stream("POST", url, content=b"{}") as r:
            chunks = r.aiter_raw()
            assert await chunks.__anext__() == b"data: first\n\n"  # before the server sends the rest
            release.set()
            assert await chunks.__anext__() == b"data: second\n\n"
            with pytest.raises(StopAsyncIteration):
                await chunks.__anext__()
        r2 = await client.post(url, content=b"xy")
        assert r2.json() == {"echo": 2} and len(conns) == 1


async def test_a_stale_keep_alive_connection_is_retried_once_on_a_fresh_one() -> None:
    async def one_answer_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        with contextlib.suppress(Exception):
            await reader.read(1)  # the next request arrives on a connection about to close: no answer

    transport = EngineTransport()
    async with (
        server(one_answer_then_close) as (url, conns),
        httpx.AsyncClient(transport=transport) as client,
    ):
        assert (await client.post(url, content=b"1")).text == "ok"
        assert (await client.post(url, content=b"2")).text == "ok"
        assert len(conns) == 2


async def test_connection_refused_is_connect_error() -> None:
    async with httpx.AsyncClient(transport=EngineTransport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{free_port()}/")


async def test_read_timeout_and_broken_body() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async def short_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly-this")
        await writer.drain()

    async with (
        server(silent) as (url, _),
        httpx.AsyncClient(transport=EngineTransport(), timeout=0.2) as client,
    ):
        with pytest.raises(httpx.ReadTimeout):
            await client.post(url, content=b"x")
    async with server(short_body) as (url, _), httpx.AsyncClient(transport=EngineTransport()) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(url, content=b"x")


async def test_connection_close_and_bodiless_responses() -> None:
    async def close_delimited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head, _ = await read_request(reader)
        if b"/empty" in head:
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await writer.drain()
            await keep_alive_json(reader, writer, n)
            return
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\nbusy, try later")
        await writer.drain()

    transport = EngineTransport()
    async with server(close_delimited) as (url, conns), httpx.AsyncClient(transport=transport) as client:
        r = await client.post(url + "/busy", content=b"x")
        assert r.status_code == 503 and r.text == "busy, try later"
        r = await client.post(url + "/empty", content=b"x")
        assert r.status_code == 204 and r.content == b""
        assert (await client.post(url + "/after", content=b"abc")).json() == {"echo": 3}
        assert len(conns) == 2  # the close-delimited response's connection was not reused


async def test_head_split_across_reads_1xx_skipped_and_chunked_trailers() -> None:
    async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        wire = (
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 201 Created\r\nx-a: 1\r\ntransfer-encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: t\r\n\r\n"
        )
        for i in range(0, len(wire), 7):
            writer.write(wire[i : i + 7])
            await writer.drain()
            await asyncio.sleep(0)
        await keep_alive_json(reader, writer, n)

    transport = EngineTransport()
    async with server(dribble) as (url, conns), httpx.AsyncClient(transport=transport) as client:
        r = await client.post(url, content=b"x")
        assert r.status_code == 201 and r.reason_phrase == "Created" and r.text == "hello world"
        assert r.headers["x-a"] == "1"
        assert (await client.post(url, content=b"abcd")).json() == {"echo": 4}
        assert len(conns) == 1


async def test_head_response_has_no_body_and_keeps_the_connection() -> None:
    async def head_then_json(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 42\r\n\r\n")
        await writer.drain()
        await keep_alive_json(reader, writer, n)

    transport = EngineTransport()
    async with server(head_then_json) as (url, conns), httpx.AsyncClient(transport=transport) as client:
        r = await client.head(url)
        assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "42"
        assert (await client.post(url, content=b"ab")).json() == {"echo": 2}
        assert len(conns) == 1


async def test_malformed_head_and_broken_chunked_body_are_protocol_errors() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"NOT-HTTP nonsense\r\n\r\n")
        await writer.drain()

    async def cut_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()

    async with server(garbage) as (url, _), httpx.AsyncClient(transport=EngineTransport()) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(url, content=b"x")
    async with (
        server(cut_chunked) as (url, _),
        httpx.AsyncClient(transport=EngineTransport()) as client,
        client.stream("POST", url, content=b"x") as r,
    ):
        chunks = r.aiter_raw()
        assert await chunks.__anext__() == b"hello"
        with pytest.raises(httpx.RemoteProtocolError):
            await chunks.__anext__()


async def test_chunks_arriving_together_are_still_yielded_one_by_one() -> None:
    async def burst(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n"
        )
        await writer.drain()
        await keep_alive_json(reader, writer, n)

    async with server(burst) as (url, conns), httpx.AsyncClient(transport=EngineTransport()) as client:
        async with client.stream("POST", url, content=b"x") as r:
            assert [c async for c in r.aiter_raw()] == [b"one", b"two"]
        assert (await client.post(url, content=b"x")).json() == {"echo": 1}
        assert len(conns) == 1


async def test_switching_protocols_passes_the_rest_of_the_connection_through() -> None:
    async def upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\nraw-1")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"raw-2")
        await writer.drain()

    transport = EngineTransport()
    async with server(upgrade) as (url, _), httpx.AsyncClient(transport=transport) as client:
        r = await asyncio.wait_for(client.get(url), 5)
        assert r.status_code == 101 and r.content == b"raw-1raw-2"
        assert not any(transport._idle.values())
