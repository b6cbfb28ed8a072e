"""The sidecar's error shape and its exception handlers.

Every error a client can meet is JSON in OpenAI's shape
``{"error": {"message", "type", "param", "code", ...}}`` (never a plain-text 500 or a traceback):

- 400 ``invalid_request``: the body is not a JSON object (or is nested too deeply), a header is
  malformed, or a session id cannot be controlled (see sidecar/README.md).
- 401 ``unauthorized``: a control endpoint without the operator bearer token; a read endpoint without
  the viewer token when ``PREFIXOPS_VIEWER_TOKEN`` is set; traffic, session end or a compaction request
  without the client token when ``PREFIXOPS_CLIENT_TOKEN`` is set.
- 403 ``read_only``: a control endpoint while no operator token is configured.
- 404 ``unknown_session``: an operator action or DELETE names a session the sidecar does not know.
- 409 ``session_ended``: a held request whose session was ended while it waited.
- 413 ``body_too_large``: the request body exceeds the limit.
- 415 ``unsupported_media_type``: a request body that is not ``application/json``.
- 421 ``misdirected_request``: the Host header is not one of ``--allowed-hosts``.
- 422 ``invalid_value``: a field is out of range; ``param`` and ``value`` name it.
- 500 ``internal_error``: a bug; the message says so and the traceback goes to the log only.
- 502 ``engine_unavailable`` / 504 ``engine_timeout``: the engine could not be reached or did not answer.
- 503 ``session_parked``: a held turn waited longer than ``--max-hold``; ``Retry-After`` is set.
- 503 ``not_persisted``: a control change could not be written to the state store (it was not applied).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered to the client in the documented shape."""

    def __init__(
        self, status: int, kind: str, message: str, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers
        self.extra = extra


def error_body(kind: str, message: str, code: int, **extra: Any) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": kind, "param": extra.pop("field", None), "code": code, **extra}
    }


def error_response(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(
        json_safe(error_body(kind, message, status, **extra)), status_code=status, headers=headers
    )


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats and unknown objects turned into strings (JSON can carry it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def _short(value: Any) -> str:
    try:
        return json.dumps(value)[:200]
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:200]


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.kind, exc.message, exc.headers, **exc.extra)


async def validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    first_field: str | None = None
    first_value: Any = None
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
        field = ".".join(loc) or "body"
        value = json_safe(err.get("input"))
        if first_field is None:
            first_field, first_value = field, value
        parts.append(f"{field}: {err.get('msg')} (got {_short(value)})")
    if first_field == "body" and isinstance(first_value, str) and len(first_value) > 200:
        first_value = first_value[:200]
    return error_response(
        422, "invalid_value", "; ".join(parts) or "invalid request", field=first_field, value=first_value
    )


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    log.error(
        "internal error on %s %s: %s: %s",
        request.method,
        request.url.path,
        type(exc).__name__,
        exc,
        exc_info=exc if not isinstance(exc, RecursionError) else None,
    )
    return error_response(
        500, "internal_error", f"internal error ({type(exc).__name__}); see the sidecar log"
    )


HTTP_KINDS = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_value",
}


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (unknown route, wrong method, a body it could not read) in the documented shape."""
    assert isinstance(exc, StarletteHTTPException)
    kind = HTTP_KINDS.get(exc.status_code, "invalid_request" if exc.status_code < 500 else "internal_error")
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(exc.status_code, kind, message, dict(exc.headers) if exc.headers else None)


async def recursion_handler(request: Request, exc: Exception) -> JSONResponse:
    return error_response(400, "invalid_request", "request body is nested too deeply", field="body")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(RecursionError, recursion_handler)
    app.add_exception_handler(Exception, internal_error_handler)
