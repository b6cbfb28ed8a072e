"""HTTP shell of the sidecar: the OpenAI-compatible proxy, read endpoints and the control API.

Errors a client can meet (all JSON, OpenAI's shape ``{"error": {"message", "type", ...}}``):

- 400 ``invalid_request``: the body is not a JSON object, or a header is malformed.
- 401 ``unauthorized``: a control endpoint without the operator bearer token, or a read
  endpoint without the viewer token when ``PREFIXOPS_VIEWER_TOKEN`` is set.
- 403 ``read_only``: a control endpoint while no operator token is configured.
- 404 ``unknown_session``: an operator action or DELETE names a session the sidecar does not know.
- 409 ``session_ended``: a held request whose session was ended while it waited.
- 413 ``body_too_large``: the request body exceeds the limit.
- 422 ``invalid_value``: a field is out of range; ``field`` and ``value`` name it.
- 502 ``engine_unavailable`` / 504 ``engine_timeout``: the engine could not be reached or did not answer.
- 503 ``session_parked``: a held turn waited longer than ``--max-hold``; ``Retry-After`` is set.
"""

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import itertools
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

import anyio
import httpx
from fastapi import Body, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.budgeter import CONTROLS, ConfigError, UnknownSession
from core.compaction import URGENCIES

from .control import ControlPlane
from .engine_transport import EngineTransport
from .metrics import SidecarCollector
from .pool import fetch_pool_tokens
from .settings import Settings
from .store import Store
from .wire import AuditEntry, DecisionDoc, HealthDoc, SessionDoc, SessionDocState, SessionsPage, StateDoc

log = logging.getLogger(__name__)

HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailers",
    b"transfer-encoding", b"upgrade", b"host", b"content-length", b"accept-encoding",
}  # X-Session-Id & co. go through: engines ignore them, session-affinity routers and the simulator use them
RESPONSE_DROP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "date",
                 "server"}
SESSION_ID_RE = re.compile(r"^[\x21-\x7e]{1,256}$")
ACTOR_RE = re.compile(r"^[\x20-\x7e]{1,200}$")
TRUE_VALUES = {"true", "1", "yes"}

# ----------------------------------------------------------------------------- errors


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers
        self.extra = extra


def error_body(kind: str, message: str, code: int, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": extra.pop("field", None), "code": code,
                      **extra}}


def error_response(status: int, kind: str, message: str, headers: dict[str, str] | None = None,
                   **extra: Any) -> JSONResponse:
    return JSONResponse(error_body(kind, message, status, **extra), status_code=status, headers=headers)


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


# ------------------------------------------------------------------------- body limit


class BodyLimit:
    """Pure ASGI middleware: 413 for bodies over the limit (control paths get a smaller one)."""

    def __init__(self, app: ASGIApp, max_bytes: int, control_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.control_bytes = control_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        proxied = scope["path"].startswith("/v1/")
        limit = self.max_bytes if proxied else self.control_bytes
        if not proxied:
            # Control bodies are JSON whatever the header says (`curl -d` sends a form content type).
            scope = dict(scope, headers=[*(h for h in scope["headers"] if h[0] != b"content-type"),
                                         (b"content-type", b"application/json")])
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit or declared < 0:
                    response = error_response(413 if declared > limit else 400,
                                              "body_too_large" if declared > limit else "invalid_request",
                                              f"request body of {value.decode(errors='replace')} bytes; "
                                              f"the limit is {limit} bytes", field="body")
                    await response(scope, receive, send)
                    return
                break
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(413, "body_too_large", f"request body exceeds the limit of {limit} bytes",
                                   field="body")
            return message

        await self.app(scope, limited_receive, send)


# ------------------------------------------------------------------------- models


Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class BudgeterUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal[CONTROLS] | None = None  # type: ignore[valid-type]
    low: Finite | None = Field(default=None, gt=0, lt=1)
    high: Finite | None = Field(default=None, gt=0, le=1)
    session_cap: int | None = Field(default=None, ge=1, le=1_000_000, strict=True)
    latency_limit_s: Finite | None = Field(default=None, gt=0, le=86400)


class UnparkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pin: bool = Field(default=False, strict=True)


class ParkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=1000)


class DeferBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    until: dt.datetime | None = Field(default=None, description="ISO 8601 time (or Unix seconds) the deferral ends")
    minutes: Finite | None = Field(default=None, gt=0, le=7 * 24 * 60)
    reason: str = Field(default="", max_length=1000)


class AllowBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=1000)


SubtreeId = Annotated[str, Field(min_length=1, max_length=256)]


class CompactionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subtrees: list[SubtreeId] = Field(min_length=1, max_length=1000)
    reason: str = Field(default="", max_length=1000)
    urgency: Literal[URGENCIES] = "normal"  # type: ignore[valid-type]


# -------------------------------------------------------------------- request helpers


def estimate_prompt_tokens(payload: dict[str, Any], chars_per_token: float) -> int:
    """Prompt size before the engine answers (for demand of the prompt in flight): characters / ratio."""
    chars = 0
    tokens = 0
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        chars += len(part["text"])
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        chars += len(prompt)
    elif isinstance(prompt, list):
        for item in prompt:
            if isinstance(item, str):
                chars += len(item)
            elif isinstance(item, int):
                tokens += 1
            elif isinstance(item, list):
                tokens += len(item)
    return tokens + math.ceil(chars / chars_per_token)


def output_budget(payload: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def subtree_of(payload: dict[str, Any], header: str | None) -> str | None:
    if header:
        return header[:256]
    messages = payload.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict) \
            and messages[0].get("role") in ("system", "developer"):
        content = messages[0].get("content")
        if not isinstance(content, str):
            content = json.dumps(content, sort_keys=True)
        return "sys-" + hashlib.blake2b(content.encode(), digest_size=8).hexdigest()
    return None


def usage_numbers(usage: Any) -> tuple[int | None, int | None, int | None]:
    """(prompt, cached or None when not reported, completion) from an OpenAI usage object."""
    if not isinstance(usage, dict):
        return None, None, None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    def as_int(v: Any) -> int | None:
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None
    return as_int(prompt), as_int(cached), as_int(completion)


# ------------------------------------------------------------------------------- app


def create_app(settings: Settings, *, store: Store | None = None,
               transport: httpx.AsyncBaseTransport | None = None,
               clock: Callable[[], float] = time.time) -> FastAPI:
    """The sidecar app. ``store`` defaults to the SQLite db at ``settings.state_db``; ``transport`` and
    ``clock`` are test seams."""
    if store is None:
        store = Store(settings.state_db)
    cp = ControlPlane(settings, store, clock)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SidecarCollector(cp))
    request_ids = itertools.count(1)
    engine = settings.engine.rstrip("/")
    background: list[asyncio.Task[None]] = []
    holder: dict[str, httpx.AsyncClient] = {}

    async def pool_loop() -> None:
        client = holder["client"]
        while True:
            tokens, kind, error = await fetch_pool_tokens(client, engine)
            if error:
                log.warning("%s", error)
            cp.set_pool(tokens, kind, error)
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
        timeout = httpx.Timeout(settings.engine_timeout_s, connect=settings.engine_connect_timeout_s)
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512, keepalive_expiry=30)
        engine_transport = transport
        if engine_transport is None and settings.engine_transport == "fast":
            engine_transport = EngineTransport()
        holder["client"] = httpx.AsyncClient(timeout=timeout, limits=limits, transport=engine_transport,
                                             follow_redirects=False)
        if not settings.operator_token:
            log.warning("PREFIXOPS_OPERATOR_TOKEN is not set: the control API is read-only")
        if settings.viewer_token:
            log.info("read endpoints need the viewer (or operator) token")
        background.append(asyncio.create_task(pool_loop()))
        background.append(asyncio.create_task(tick_loop()))
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            background.clear()
            cp.persist(force=True)
            await holder["client"].aclose()
            store.close()

    app = FastAPI(
        title="PrefixOps sidecar",
        version="1.0",
        description="Session-aware OpenAI-compatible proxy: reuse measurement, KV budgeter, compaction gate.",
        lifespan=lifespan,
    )
    app.state.control = cp
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, control_bytes=settings.control_body_bytes)

    @app.exception_handler(ApiError)
    async def api_error_handler(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.kind, exc.message, exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def validation_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        parts = []
        first_field, first_value = None, None
        for err in errors:
            loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
            field = ".".join(loc) or "body"
            value = json_safe(err.get("input"))
            if first_field is None:
                first_field, first_value = field, value
            parts.append(f"{field}: {err.get('msg')} (got {json.dumps(value)[:200]})")
        return error_response(422, "invalid_value", "; ".join(parts) or "invalid request", field=first_field,
                              value=first_value)

    # ------------------------------------------------------------------ auth
    def bearer(request: Request) -> str | None:
        header = request.headers.get("authorization")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    def token_matches(token: str | None, expected: str | None) -> bool:
        if token is None or not expected:
            return False
        return hmac.compare_digest(token.encode(), expected.encode())

    def actor_of(request: Request, role: str) -> str:
        actor = request.headers.get("x-actor")
        if actor is not None and not ACTOR_RE.match(actor):
            raise ApiError(400, "invalid_request", f"X-Actor must be 1-200 printable ASCII characters, got "
                           f"{actor[:50]!r}", field="X-Actor", value=actor[:200])
        return actor or role

    def require_operator(request: Request) -> tuple[str, str]:
        if not settings.operator_token:
            raise ApiError(403, "read_only", "the sidecar is read-only: PREFIXOPS_OPERATOR_TOKEN is not set")
        token = bearer(request)
        if not token_matches(token, settings.operator_token):
            raise ApiError(401, "unauthorized",
                           "operator token missing" if token is None else "operator token not accepted",
                           headers={"WWW-Authenticate": "Bearer"})
        return actor_of(request, "operator"), "operator"

    def require_viewer(request: Request) -> None:
        if not settings.viewer_token:
            return
        token = bearer(request)
        ok_viewer = token_matches(token, settings.viewer_token)
        ok_operator = token_matches(token, settings.operator_token)
        if not (ok_viewer or ok_operator):
            raise ApiError(401, "unauthorized",
                           "viewer token missing" if token is None else "viewer token not accepted",
                           headers={"WWW-Authenticate": "Bearer"})

    Operator = Annotated[tuple[str, str], Depends(require_operator)]
    Viewer = Annotated[None, Depends(require_viewer)]

    # ----------------------------------------------------------------- proxy
    def forward_headers(request: Request) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in request.headers.raw if k not in HOP_BY_HOP]
        headers.append((b"accept-encoding", b"identity"))
        return headers

    def response_headers(response: httpx.Response) -> dict[str, str]:
        return {k: v for k, v in response.headers.items() if k.lower() not in RESPONSE_DROP}

    async def read_body(request: Request) -> bytes:
        return await request.body()

    def engine_error(exc: httpx.HTTPError) -> JSONResponse:
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            status, kind = 504, "engine_timeout"
            message = f"engine {engine} did not answer in time ({type(exc).__name__})"
        else:
            status, kind = 502, "engine_unavailable"
            message = f"engine {engine} unreachable: {type(exc).__name__}: {exc}"
        cp.engine_failed(message)
        log.warning("%s", message)
        return error_response(status, kind, message)

    async def admit(request: Request, session_id: str, prompt_tokens: int, budget: int | None) -> Response | None:
        """Forward now (None) or hold until released; a Response when the held request ends otherwise."""
        while True:
            decision = cp.request_turn(session_id, prompt_tokens, budget)
            if decision == "forward":
                return None
            outcome = await cp.hold(session_id, request.receive)
            if outcome == "forward":
                return None
            if outcome == "retry":
                continue
            if outcome == "ended":
                return error_response(409, "session_ended",
                                      f"session {session_id!r} was ended while its turn was held")
            if outcome == "disconnected":
                return Response(status_code=499)
            retry = max(1, min(60, int(settings.max_hold_s // 10) or 1))
            return error_response(
                503, "session_parked",
                f"session {session_id!r} is parked: its turn was held {settings.max_hold_s:g} s without "
                f"re-admission; retry later", headers={"Retry-After": str(retry)}, session=session_id)

    async def proxy_completion(request: Request, path: str) -> Response:
        body = await read_body(request)
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return error_response(400, "invalid_request", f"request body is not valid JSON: {exc}", field="body")
        if not isinstance(payload, dict):
            return error_response(400, "invalid_request",
                                  f"request body must be a JSON object, got {type(payload).__name__}",
                                  field="body")
        headers = request.headers
        session_id = headers.get("x-session-id")
        if session_id is not None and not SESSION_ID_RE.match(session_id):
            return error_response(400, "invalid_request",
                                  "X-Session-Id must be 1-256 printable ASCII characters without spaces, got "
                                  f"{session_id[:60]!r}", field="X-Session-Id")
        end_value = headers.get("x-session-end")
        end_session = end_value is not None and end_value.strip().lower() in TRUE_VALUES
        subtree = subtree_of(payload, headers.get("x-prefix-id"))
        prompt_estimate = estimate_prompt_tokens(payload, settings.chars_per_token)
        budget = output_budget(payload)
        stream = payload.get("stream") is True
        stream_options = payload.get("stream_options")
        client_wants_usage = isinstance(stream_options, dict) and stream_options.get("include_usage") is True
        injected = False
        if stream and not client_wants_usage:
            payload["stream_options"] = {**(stream_options if isinstance(stream_options, dict) else {}),
                                         "include_usage": True}
            body = json.dumps(payload).encode()
            injected = True

        request_id = ""
        if session_id is not None:
            held = await admit(request, session_id, prompt_estimate, budget)
            if held is not None:
                cp.counters.request(path, f"held_{held.status_code}")
                return held
        else:
            request_id = f"u{next(request_ids)}"
            cp.budgeter.add_unsessioned(
                request_id, prompt_estimate + (cp.budgeter.config.default_output_budget if budget is None else budget))
            cp.unsessioned_in_flight += 1
            cp.counters.unsessioned_requests += 1

        started = time.monotonic()
        cp.in_flight += 1
        finished = False

        def finish(usage: Any, ok: bool) -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            cp.in_flight -= 1
            prompt, cached, completion = usage_numbers(usage)
            if ok and prompt is None:
                # A success without usage (an engine that reports none): the turn counts, its cache use is
                # unknown, and the prompt size is the estimate.
                prompt, cached, completion = prompt_estimate, None, completion or 0
            cp.turn_done(session_id, prompt, cached, completion, time.monotonic() - started, ok, subtree)
            if session_id is None:
                cp.budgeter.remove_unsessioned(request_id)
                cp.unsessioned_in_flight -= 1
            elif end_session:
                cp.end_session(session_id, "client")
            cp.release()
            cp.counters.request(path, "ok" if ok else "error")

        client = holder["client"]
        url = engine + path
        fwd = forward_headers(request)
        if not stream:
            try:
                response = await client.post(url, content=body, headers=fwd)
            except httpx.HTTPError as exc:
                finish(None, False)
                return engine_error(exc)
            usage = None
            ok = response.status_code == 200
            if ok:
                try:
                    usage = json.loads(response.content).get("usage")
                except (ValueError, AttributeError):
                    usage = None
            finish(usage, ok)
            return Response(content=response.content, status_code=response.status_code,
                            headers=response_headers(response))

        try:
            upstream = await client.send(client.build_request("POST", url, content=body, headers=fwd), stream=True)
        except httpx.HTTPError as exc:
            finish(None, False)
            return engine_error(exc)
        if upstream.status_code != 200:
            try:
                content = await upstream.aread()
            except httpx.HTTPError as exc:
                finish(None, False)
                return engine_error(exc)
            finally:
                await upstream.aclose()
            finish(None, False)
            return Response(content=content, status_code=upstream.status_code, headers=response_headers(upstream))

        async def events() -> AsyncIterator[bytes]:
            usage: Any = None
            buffer = b""
            completed = False
            try:
                async for chunk in upstream.aiter_raw():
                    buffer += chunk
                    if b"\n\n" not in buffer:
                        continue
                    *complete, buffer = buffer.split(b"\n\n")
                    out = []
                    for event in complete:
                        if event.startswith(b"data: [DONE]"):
                            completed = True
                            finish(usage, True)
                        elif b'"usage"' in event and event.startswith(b"data:"):
                            try:
                                data = json.loads(event[5:])
                            except ValueError:
                                data = None
                            if isinstance(data, dict) and data.get("usage"):
                                usage = data["usage"]
                                if injected:
                                    if not data.get("choices"):
                                        continue
                                    data.pop("usage", None)
                                    event = b"data: " + json.dumps(data).encode()
                            elif isinstance(data, dict) and injected and "usage" in data:
                                data.pop("usage", None)
                                event = b"data: " + json.dumps(data).encode()
                        out.append(event + b"\n\n")
                    if out:
                        yield b"".join(out)
                if buffer.strip():
                    yield buffer
                if not completed:
                    finish(usage, usage is not None)
            except httpx.HTTPError as exc:
                message = f"engine stream from {engine} broke off: {type(exc).__name__}: {exc}"
                cp.engine_failed(message)
                log.warning("%s", message)
                finish(None, False)
                yield b"data: " + json.dumps(error_body("engine_unavailable", message, 502)).encode() + b"\n\n"
            finally:
                finish(usage if completed else None, completed)
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()

        return StreamingResponse(events(), status_code=200, headers=response_headers(upstream),
                                 media_type=upstream.headers.get("content-type", "text/event-stream"))

    completion_body = {"content": {"application/json": {"schema": {"type": "object"}}}, "required": True}

    @app.post("/v1/chat/completions", tags=["proxy"], openapi_extra={"requestBody": completion_body},
              summary="OpenAI chat completions, proxied (X-Session-Id, X-Session-End, X-Prefix-Id headers)")
    async def chat_completions(request: Request) -> Response:
        return await proxy_completion(request, "/v1/chat/completions")

    @app.post("/v1/completions", tags=["proxy"], openapi_extra={"requestBody": completion_body},
              summary="OpenAI completions, proxied")
    async def completions(request: Request) -> Response:
        return await proxy_completion(request, "/v1/completions")

    @app.get("/v1/models", tags=["proxy"], summary="The engine's model list, proxied")
    async def models(request: Request) -> Response:
        try:
            response = await holder["client"].get(engine + "/v1/models", headers=forward_headers(request))
        except httpx.HTTPError as exc:
            return engine_error(exc)
        return Response(content=response.content, status_code=response.status_code,
                        headers=response_headers(response))

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"], include_in_schema=False)
    async def passthrough(request: Request, path: str) -> Response:
        """Other OpenAI/vLLM endpoints (embeddings, tokenize, ...): forwarded, not measured."""
        body = await read_body(request) if request.method == "POST" else b""
        url = engine + "/v1/" + path + (("?" + request.url.query) if request.url.query else "")
        try:
            response = await holder["client"].request(request.method, url, content=body,
                                                      headers=forward_headers(request))
        except httpx.HTTPError as exc:
            return engine_error(exc)
        return Response(content=response.content, status_code=response.status_code,
                        headers=response_headers(response))

    # ------------------------------------------------------------------ reads
    @app.get("/healthz", tags=["read"], response_model=HealthDoc)
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "uptime_s": cp.clock() - cp.started_at, "engine": engine,
                "read_only": not settings.operator_token}

    @app.get("/state", tags=["read"], dependencies=[Depends(require_viewer)], response_model=StateDoc)
    async def state(request: Request) -> JSONResponse:
        return JSONResponse(json_safe(cp.state_doc()))

    @app.get("/sessions", tags=["read"], dependencies=[Depends(require_viewer)],
             response_model=list[SessionDoc] | SessionsPage,
             summary="Sessions: the whole list, or with updated_after / limit / cursor one page "
                     '{"sessions": [...], "next": CURSOR or null} in ascending (updated_at, id) order')
    async def sessions(request: Request,
                       state: SessionDocState | None = None,
                       include_ended: bool = True,
                       updated_after: Annotated[float | None, Query(allow_inf_nan=False)] = None,
                       limit: Annotated[int | None, Query(ge=1, le=10000)] = None,
                       cursor: Annotated[str | None, Query(max_length=600)] = None) -> JSONResponse:
        if updated_after is None and limit is None and cursor is None:
            return JSONResponse(json_safe(cp.sessions_doc(include_ended=include_ended, state=state)))
        after: tuple[float, str] | None = None
        if cursor is not None:
            ts_text, sep, sid = cursor.partition(":")
            try:
                after = (float(ts_text), sid)
            except ValueError:
                after = None
            if not sep or after is None or not math.isfinite(after[0]):
                raise ApiError(422, "invalid_value", f"cursor must be a 'next' value of /sessions, got "
                               f"{cursor[:80]!r}", field="cursor", value=cursor[:200])
        page, last = cp.sessions_page(updated_after=updated_after, cursor=after, limit=limit or 1000,
                                      include_ended=include_ended, state=state)
        return JSONResponse(json_safe({"sessions": page,
                                       "next": None if last is None else f"{last[0]!r}:{last[1]}"}))

    @app.get("/sessions/{session_id}", tags=["read"], dependencies=[Depends(require_viewer)],
             response_model=SessionDoc)
    async def session(request: Request, session_id: Annotated[str, Path(max_length=256, examples=["agent-1"])]) -> JSONResponse:
        try:
            return JSONResponse(json_safe(cp.session_doc(session_id)))
        except UnknownSession:
            for record in reversed(cp.ended):
                if record["id"] == session_id:
                    return JSONResponse(json_safe(record))
            raise ApiError(404, "unknown_session", f"unknown session {session_id!r}", session=session_id) from None

    @app.delete("/sessions/{session_id}", tags=["traffic"],
                summary="End a session (as X-Session-End: true does); held turns get 409")
    async def delete_session(request: Request, session_id: Annotated[str, Path(max_length=256, examples=["agent-1"])]) -> JSONResponse:
        token = bearer(request)
        if settings.operator_token and token_matches(token, settings.operator_token):
            actor, role = actor_of(request, "operator"), "operator"
        else:
            actor, role = "client", "client"
        try:
            record, audit_id = cp.delete_session(session_id, actor, role)
        except UnknownSession:
            raise ApiError(404, "unknown_session", f"unknown session {session_id!r}", session=session_id) from None
        cp.release()
        return JSONResponse(json_safe({"session": record, "audit_id": audit_id}))

    @app.get("/subtrees", tags=["read"], dependencies=[Depends(require_viewer)])
    async def subtrees(request: Request) -> JSONResponse:
        return JSONResponse(json_safe(cp.subtrees_doc()))

    @app.get("/compaction/decisions", tags=["read"], dependencies=[Depends(require_viewer)],
             response_model=list[DecisionDoc])
    async def compaction_decisions(request: Request, after_id: Annotated[int, Query(ge=0)] = 0,
                                   limit: Annotated[int, Query(ge=1, le=10000)] = 1000) -> JSONResponse:
        return JSONResponse(json_safe(store.decisions(after_id, limit)))

    @app.get("/audit", tags=["read"], dependencies=[Depends(require_viewer)], response_model=list[AuditEntry])
    async def audit(request: Request, after_id: Annotated[int, Query(ge=0)] = 0,
                    limit: Annotated[int, Query(ge=1, le=10000)] = 1000) -> JSONResponse:
        return JSONResponse(json_safe(store.audit(after_id, limit)))

    @app.get("/metrics", tags=["read"])
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/compaction/requests", tags=["compaction"],
              summary="A context store asks to compact subtrees; each gets granted or deferred with a reason")
    async def compaction_requests(_: Viewer, body: CompactionRequest) -> JSONResponse:
        request_id = f"c{int(cp.clock() * 1000)}-{next(request_ids)}"
        rows = cp.request_compaction(list(body.subtrees), body.urgency, body.reason, request_id)
        return JSONResponse(json_safe({
            "request_id": request_id,
            "urgency": body.urgency,
            "regime": rows[0]["regime"] if rows else cp.regime.regime,
            "decisions": [{"id": r["id"], "subtree": r["subtree_id"], "decision": r["decision"],
                           "reason": r["reason"], "warm": r["warm"]} for r in rows],
            "granted": [r["subtree_id"] for r in rows if r["decision"] == "granted"],
            "deferred": [r["subtree_id"] for r in rows if r["decision"] == "deferred"],
        }))

    # --------------------------------------------------------------- control
    @app.put("/control/budgeter", tags=["control"], summary="Change mode and/or bands (partial update)")
    async def control_budgeter(who: Operator, body: BudgeterUpdate) -> JSONResponse:
        actor, role = who
        changes = body.model_dump(exclude_none=True)
        if not changes:
            raise ApiError(422, "invalid_value", "the body must set at least one of mode, low, high, "
                           "session_cap, latency_limit_s", field="body", value={})
        try:
            after, audit_id = cp.update_budgeter(changes, actor, role)
        except ConfigError as exc:
            field = next((k for k in ("low", "high", "mode", "session_cap", "latency_limit_s")
                          if k in str(exc)), "body")
            raise ApiError(422, "invalid_value", str(exc), field=field, value=json_safe(changes)) from None
        return JSONResponse(json_safe({"budgeter": after, "audit_id": audit_id}))

    @app.post("/control/sessions/{session_id}/park", tags=["control"])
    async def control_park(who: Operator, session_id: Annotated[str, Path(max_length=256, examples=["agent-1"])],
                           body: Annotated[ParkBody | None, Body()] = None) -> JSONResponse:
        actor, role = who
        try:
            doc, audit_id = cp.park(session_id, actor, role)
        except UnknownSession:
            raise ApiError(404, "unknown_session", f"unknown session {session_id!r}", session=session_id) from None
        return JSONResponse(json_safe({"session": doc, "audit_id": audit_id}))

    @app.post("/control/sessions/{session_id}/unpark", tags=["control"])
    async def control_unpark(who: Operator, session_id: Annotated[str, Path(max_length=256, examples=["agent-1"])],
                             body: Annotated[UnparkBody | None, Body()] = None) -> JSONResponse:
        actor, role = who
        pin = body.pin if body is not None else False
        try:
            doc, audit_id = cp.unpark(session_id, pin, actor, role)
        except UnknownSession:
            raise ApiError(404, "unknown_session", f"unknown session {session_id!r}", session=session_id) from None
        return JSONResponse(json_safe({"session": doc, "audit_id": audit_id}))

    @app.post("/control/compaction/defer", tags=["control"],
              summary="Defer every compaction until a time (`until`) or for `minutes`")
    async def control_defer(who: Operator, body: DeferBody) -> JSONResponse:
        actor, role = who
        now = cp.clock()
        if (body.until is None) == (body.minutes is None):
            raise ApiError(422, "invalid_value", "give exactly one of until and minutes", field="until",
                           value=json_safe(body.model_dump(mode="json")))
        if body.until is not None:
            until_dt = body.until if body.until.tzinfo else body.until.replace(tzinfo=dt.UTC)
            until = until_dt.timestamp()
            if not until > now:
                raise ApiError(422, "invalid_value", f"until must be in the future, got {body.until.isoformat()}",
                               field="until", value=body.until.isoformat())
            if until - now > 7 * 24 * 3600:
                raise ApiError(422, "invalid_value", f"until must be within 7 days, got {body.until.isoformat()}",
                               field="until", value=body.until.isoformat())
        else:
            assert body.minutes is not None
            until = now + body.minutes * 60.0
        after, audit_id = cp.defer_compaction(until, body.reason, actor, role)
        return JSONResponse(json_safe({"compaction": after, "audit_id": audit_id}))

    @app.post("/control/compaction/allow", tags=["control"], summary="End an operator compaction deferral")
    async def control_allow(who: Operator, body: Annotated[AllowBody | None, Body()] = None) -> JSONResponse:
        actor, role = who
        after, audit_id = cp.allow_compaction(actor, role)
        return JSONResponse(json_safe({"compaction": after, "audit_id": audit_id}))

    return app
