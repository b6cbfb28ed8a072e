"""Traffic routes: the OpenAI-compatible proxy (/v1/*), session end and compaction requests."""

import itertools
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import anyio
import httpx
from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from core.budgeter import UnknownSession
from core.compaction import URGENCIES

from .context import Sidecar
from .control import HELD_STATUS, TurnRefused, TurnTicket
from .errors import ApiError, error_body, error_response, json_safe
from .openai_payload import SseReframer, output_budget, prompt_size, subtree_of, usage_numbers

log = logging.getLogger(__name__)

SESSION_ID_RE = re.compile(r"^[\x21-\x7e]{1,256}$")
TRUE_VALUES = {"true", "1", "yes"}
SubtreeId = Annotated[str, Field(min_length=1, max_length=256)]
SessionIdPath = Annotated[str, Path(max_length=256, examples=["agent-1"])]
COMPLETION_BODY = {"content": {"application/json": {"schema": {"type": "object"}}}, "required": True}


class CompactionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subtrees: list[SubtreeId] = Field(min_length=1, max_length=1000)
    reason: str = Field(default="", max_length=1000)
    urgency: Literal[URGENCIES] = "normal"  # type: ignore[valid-type]


def check_session_id(session_id: str) -> None:
    """Session ids are 1-256 printable ASCII characters without spaces; ``/`` is fine (``tenant/agent``), but
    a ``.`` or ``..`` path segment is refused: URLs cannot address it (clients normalise it away)."""
    if not SESSION_ID_RE.match(session_id):
        raise ApiError(
            400,
            "invalid_request",
            f"X-Session-Id must be 1-256 printable ASCII characters without spaces, got {session_id[:60]!r}",
            field="X-Session-Id",
        )
    if any(part in (".", "..") for part in session_id.split("/")):
        raise ApiError(
            400,
            "invalid_request",
            "X-Session-Id must not have a '.' or '..' segment (the control "
            f"API could not address it), got {session_id[:60]!r}",
            field="X-Session-Id",
        )


def parse_payload(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            400, "invalid_request", f"request body is not valid JSON: {exc}", field="body"
        ) from None
    except RecursionError:
        raise ApiError(400, "invalid_request", "request body is nested too deeply", field="body") from None
    if not isinstance(payload, dict):
        raise ApiError(
            400,
            "invalid_request",
            f"request body must be a JSON object, got {type(payload).__name__}",
            field="body",
        )
    return payload


def router(sc: Sidecar) -> APIRouter:
    cp, engine, settings, auth = sc.cp, sc.engine, sc.settings, sc.auth
    request_ids = itertools.count(1)
    api = APIRouter()

    def held_response(outcome: str, session_id: str) -> Response:
        if outcome == "ended":
            return error_response(
                409, "session_ended", f"session {session_id!r} was ended while its turn was held"
            )
        if outcome == "disconnected":
            return Response(status_code=HELD_STATUS[outcome])
        retry = max(1, min(60, int(settings.max_hold_s // 10) or 1))
        return error_response(
            503,
            "session_parked",
            f"session {session_id!r} is parked: its turn was held {settings.max_hold_s:g} s without "
            f"re-admission; retry later",
            headers={"Retry-After": str(retry)},
            session=session_id,
        )

    async def proxy_completion(request: Request, path: str) -> Response:
        auth.client(request)  # inline, not a dependency: sync dependencies cost a thread hop per request
        body = await request.body()
        payload = parse_payload(body)
        headers = request.headers
        session_id = headers.get("x-session-id")
        if session_id is not None:
            check_session_id(session_id)
        end_value = headers.get("x-session-end")
        stream = payload.get("stream") is True
        stream_options = payload.get("stream_options")
        injected = stream and not (
            isinstance(stream_options, dict) and stream_options.get("include_usage") is True
        )
        if injected:
            payload["stream_options"] = {
                **(stream_options if isinstance(stream_options, dict) else {}),
                "include_usage": True,
            }
            body = json.dumps(payload).encode()
        chars, ids = prompt_size(payload)
        ticket = TurnTicket(
            path=path,
            session_id=session_id,
            subtree=subtree_of(payload, headers.get("x-prefix-id")),
            prompt_estimate=cp.prompts.estimate(session_id, chars, ids),
            prompt_chars=chars,
            prompt_ids=ids,
            output_budget=output_budget(payload),
            end_session=end_value is not None and end_value.strip().lower() in TRUE_VALUES,
            model=payload.get("model"),
        )
        try:
            cp.bound_turn(ticket)
            if session_id is not None:
                outcome = await cp.admit(ticket, request.receive)
                if outcome != "forward":
                    return held_response(outcome, session_id)
        except TurnRefused as exc:
            raise ApiError(exc.status, exc.kind, str(exc), field=exc.field) from None
        cp.begin_turn(ticket)
        fwd = engine.forward_headers(request)
        if not stream:
            try:
                response = await engine.post(path, body, fwd)
            except httpx.HTTPError as exc:
                cp.finish_turn(ticket, (None, None, None), False)
                return engine.error(exc)
            except BaseException:
                # cancelled in flight (the sidecar stopping with the turn still at the engine): the trace
                # keeps it, failed, and it no longer counts in flight (a stream's generator does the same)
                cp.finish_turn(ticket, (None, None, None), False)
                raise
            ok = response.status_code == 200
            usage = None
            if ok:
                try:
                    usage = json.loads(response.content).get("usage")
                except (ValueError, AttributeError, RecursionError):
                    usage = None
            cp.finish_turn(ticket, usage_numbers(usage), ok)
            return engine.relay(response)

        try:
            upstream = await engine.open_stream(path, body, fwd)
        except httpx.HTTPError as exc:
            cp.finish_turn(ticket, (None, None, None), False)
            return engine.error(exc)
        if upstream.status_code != 200:
            try:
                content = await upstream.aread()
            except httpx.HTTPError as exc:
                cp.finish_turn(ticket, (None, None, None), False)
                return engine.error(exc)
            finally:
                await upstream.aclose()
            cp.finish_turn(ticket, (None, None, None), False)
            return Response(
                content=content, status_code=upstream.status_code, headers=engine.response_headers(upstream)
            )

        async def events() -> AsyncIterator[bytes]:
            frames = SseReframer(strip_usage=injected)
            try:
                async for chunk in upstream.aiter_raw():
                    out = frames.feed(chunk)
                    if frames.done:
                        cp.finish_turn(ticket, usage_numbers(frames.usage), True)
                    if out:
                        yield out
                tail = frames.tail()
                if tail:
                    yield tail
                if not frames.done:
                    cp.finish_turn(ticket, usage_numbers(frames.usage), frames.usage is not None)
            except httpx.HTTPError as exc:
                message = f"engine stream from {engine.base} broke off: {type(exc).__name__}: {exc}"
                engine.failed(message)
                cp.finish_turn(ticket, (None, None, None), False)
                yield (
                    b"data: " + json.dumps(error_body("engine_unavailable", message, 502)).encode() + b"\n\n"
                )
            finally:
                cp.finish_turn(
                    ticket, usage_numbers(frames.usage) if frames.done else (None, None, None), frames.done
                )
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()

        return StreamingResponse(
            events(),
            status_code=200,
            headers=engine.response_headers(upstream),
            media_type=upstream.headers.get("content-type", "text/event-stream"),
        )

    @api.post(
        "/v1/chat/completions",
        tags=["proxy"],
        openapi_extra={"requestBody": COMPLETION_BODY},
        summary="OpenAI chat completions, proxied (X-Session-Id, X-Session-End, X-Prefix-Id headers)",
    )
    async def chat_completions(request: Request) -> Response:
        return await proxy_completion(request, "/v1/chat/completions")

    @api.post(
        "/v1/completions",
        tags=["proxy"],
        openapi_extra={"requestBody": COMPLETION_BODY},
        summary="OpenAI completions, proxied",
    )
    async def completions(request: Request) -> Response:
        return await proxy_completion(request, "/v1/completions")

    @api.get("/v1/models", tags=["proxy"], summary="The engine's model list, proxied")
    async def models(request: Request) -> Response:
        auth.client(request)
        return await engine.forward(request, "/v1/models", b"")

    @api.api_route("/v1/{path:path}", methods=["GET", "POST"], include_in_schema=False)
    async def passthrough(request: Request, path: str) -> Response:
        """Other OpenAI/vLLM endpoints (embeddings, tokenize, ...): forwarded, not measured."""
        auth.client(request)
        body = await request.body() if request.method == "POST" else b""
        query = ("?" + request.url.query) if request.url.query else ""
        return await engine.forward(request, "/v1/" + path + query, body)

    @api.delete(
        "/sessions/{session_id:path}",
        tags=["traffic"],
        summary="End a session (as X-Session-End: true does); held turns get 409. Needs the operator "
        "token, or the client token (PREFIXOPS_CLIENT_TOKEN) for a client ending its own session",
    )
    async def delete_session(
        who: Annotated[tuple[str, str], Depends(auth.session_ender)], session_id: SessionIdPath
    ) -> JSONResponse:
        actor, role = who
        try:
            record, audit_id = cp.delete_session(session_id, actor, role)
        except UnknownSession:
            raise ApiError(
                404, "unknown_session", f"unknown session {session_id!r}", session=session_id
            ) from None
        cp.release()
        return JSONResponse(json_safe({"session": record, "audit_id": audit_id}))

    @api.post(
        "/compaction/requests",
        tags=["compaction"],
        dependencies=[Depends(auth.requester)],
        summary="A context store asks to compact subtrees; each gets granted or deferred with a reason",
    )
    async def compaction_requests(body: CompactionRequest) -> JSONResponse:
        request_id = f"c{int(cp.clock() * 1000)}-{next(request_ids)}"
        rows = cp.request_compaction(list(body.subtrees), body.urgency, body.reason, request_id)
        return JSONResponse(
            json_safe(
                {
                    "request_id": request_id,
                    "urgency": body.urgency,
                    "regime": rows[0]["regime"] if rows else cp.regime.regime,
                    "decisions": [
                        {
                            "id": r["id"],
                            "subtree": r["subtree_id"],
                            "decision": r["decision"],
                            "reason": r["reason"],
                            "warm": r["warm"],
                        }
                        for r in rows
                    ],
                    "granted": [r["subtree_id"] for r in rows if r["decision"] == "granted"],
                    "deferred": [r["subtree_id"] for r in rows if r["decision"] == "deferred"],
                }
            )
        )

    return api
