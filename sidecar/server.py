"""The uvicorn server of ``python -m sidecar``, with a request-read timeout (``--read-timeout``).

uvicorn has no limit on how long a client may take to send a request, so 600 slowloris
connections stay open forever. `read_timeout_protocol` wraps uvicorn's httptools protocol: a
connection whose request (head and body) is not complete within the timeout (from the connection,
or from the first byte of the next request on a kept-alive one) is closed. One timer per request,
no cost per read. With ``--http h11`` the Guard middleware bounds bodies instead (408).

On stop, uvicorn lets requests in flight finish for ``GRACEFUL_SHUTDOWN_S``, then cancels them and
logs each one's traceback as an "Exception in ASGI application": 32 tracebacks on one stop of the
collapsed demo, whose turns run for tens of seconds, for what is not a fault. `CancelledAtShutdown`
makes each one line (the turn itself is recorded as failed in the trace: ``routes_traffic``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn

from .settings import Settings

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5  # seconds uvicorn waits for requests in flight on stop before it cancels them


class CancelledAtShutdown(logging.Filter):
    """A request cancelled by the stop, logged by uvicorn with its traceback: one warning line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError):
            record.msg = "a request still in flight %g s after the stop began was cancelled (%s)"
            record.args = (GRACEFUL_SHUTDOWN_S, exc)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def read_timeout_protocol(timeout_s: float) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol with a head-read deadline; None when httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class ReadTimeoutProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                log.info(
                    "closing a connection from %s: no complete request within %g s (--read-timeout)",
                    self.client,
                    timeout_s,
                )
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return ReadTimeoutProtocol


def protocol_for(settings: Settings) -> type[asyncio.Protocol] | None:
    """The read-timeout protocol when uvicorn would use httptools; None with h11."""
    if settings.http not in ("auto", "httptools"):
        log.warning("--http h11: --read-timeout bounds request bodies only, not request heads")
        return None
    protocol = read_timeout_protocol(settings.read_timeout_s)
    if protocol is None and settings.http == "httptools":
        raise RuntimeError("--http httptools: httptools is not installed")
    return protocol


def serve(app: Any, settings: Settings, protocol: type[asyncio.Protocol] | None) -> None:
    http: Any = protocol if protocol is not None else settings.http
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        log_level=settings.log_level.lower(),
        access_log=settings.access_log,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        backlog=4096,
        timeout_keep_alive=75,
        loop=settings.loop,
        http=http,
    )
    logging.getLogger("uvicorn.error").addFilter(CancelledAtShutdown())  # after Config set up logging
    uvicorn.Server(config).run()
