"""sidecar/server.py: what its stop logs for requests still in flight."""

from __future__ import annotations

import asyncio
import logging

from sidecar.server import CancelledAtShutdown


def record(exc: BaseException) -> logging.LogRecord:
    return logging.LogRecord(
        "uvicorn.error",
        logging.ERROR,
        __file__,
        1,
        "Exception in ASGI application\n",
        None,
        (type(exc), exc, None),
    )


def test_a_request_cancelled_by_the_stop_is_one_warning_line_not_a_traceback() -> None:
    cancelled = record(asyncio.CancelledError("Task cancelled, timeout graceful shutdown exceeded"))
    assert CancelledAtShutdown().filter(cancelled)
    assert cancelled.exc_info is None and cancelled.levelname == "WARNING"
    assert cancelled.getMessage() == (
        "a request still in flight 5 s after the stop began was cancelled "
        "(Task cancelled, timeout graceful shutdown exceeded)"
    )
    fault = record(ValueError("a real fault"))
    assert CancelledAtShutdown().filter(fault)
    assert fault.exc_info is not None and fault.levelname == "ERROR"
    assert fault.getMessage() == "Exception in ASGI application\n"
