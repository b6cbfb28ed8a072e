"""``python -m simulator serve``: the simulated engine behind a vLLM-compatible HTTP API.

The same ``Engine`` the offline runs use is stepped in scaled real time:
simulated time = (wall time since start) x ``speed``. A request's answer is
returned (or its stream ends) when the simulated engine has finished it, so
latency, TTFT and throughput come from the engine model, divided by ``speed``
in wall time.

Text -> tokens: 4 characters per token (``simulator.content``); prefix-stable,
so the next turn of a conversation hits the blocks of the previous one.
Answers are deterministic filler text of exactly the generated token count.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions`` (streaming and not), ``GET /metrics`` (vLLM names plus
``sim:`` ground truth), and simulator controls ``POST /sim/flush`` (prefix-cache
flush with preemption) and ``GET /sim/state``. The engine stepped in real time behind these
routes is `simulator.live_engine.LiveEngine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from simulator.config import CostModel, EngineConfig
from simulator.content import CHARS_PER_TOKEN, TextContent, filler, tokens_of_text
from simulator.engine import ABORTED, FINISHED, Engine, RequestTooLong
from simulator.engine import Request as EngineRequest
from simulator.live_engine import STREAM_INTERVAL_S, LiveEngine
from simulator.metrics import engine_registry

log = logging.getLogger(__name__)

DEFAULT_MODEL = "sim/agent-8b"
MAX_MODEL_LEN = 131_072


def render_chat(messages: list[dict[str, Any]]) -> str:
    """ChatML-style rendering with the generation prompt; a conversation's turns are prefixes of each other."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|im_start|>{m.get('role', 'user')}\n{content or ''}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def answer_text(n_tokens: int, seed: bytes) -> str:
    """Deterministic filler of exactly ``n_tokens * 4`` characters."""
    return filler(random.Random(seed), n_tokens)


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status as code."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(message: str, err_type: str, code: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, err_type, code, param), status_code=code)


@dataclass
class ServeConfig:
    model: str = DEFAULT_MODEL
    speed: float = 1.0
    seed: int = 0
    default_output_tokens: int = 200
    prompt_tokens_details: bool = True
    gc_between_turns: bool = True  # `LiveEngine`'s collection policy (its module doc)


def create_app(
    engine_config: EngineConfig | None = None, cost: CostModel | None = None, serve: ServeConfig | None = None
) -> FastAPI:
    serve = serve or ServeConfig()
    engine = Engine(engine_config or EngineConfig(), cost or CostModel(), model_name=serve.model)
    created = time.time()
    state: dict[str, Any] = {}

    def extra() -> dict[str, float]:
        live = state.get("live")
        return {
            "speed": serve.speed,
            "sessions_in_system": float(live.sessions_in_system()) if live else 0.0,
        }

    registry = engine_registry(engine, created, extra, serve.speed)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        live = LiveEngine(engine, serve.speed, gc_between_turns=serve.gc_between_turns)
        state["live"] = live
        live.start()
        log.info(
            "simulated engine %s: %d blocks x %d tokens, speed %.3g",
            serve.model,
            engine.config.num_blocks,
            engine.config.block_size,
            serve.speed,
        )
        yield
        await live.stop()

    app = FastAPI(title="PrefixOps simulated engine", lifespan=lifespan)
    app.state.engine = engine
    app.state.serve = serve

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        live: LiveEngine | None = state.get("live")
        render = functools.partial(generate_latest, registry)
        # read when no step runs ahead of the clock: only what has happened (simulator.live_engine)
        text = render() if live is None else await live.current(render)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict[str, Any]:
        return {
            "id": serve.model,
            "object": "model",
            "created": int(created),
            "owned_by": "vllm",
            "root": serve.model,
            "parent": None,
            "max_model_len": MAX_MODEL_LEN,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex[:16]}",
                    "object": "model_permission",
                    "created": int(created),
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/sim/state")
    async def sim_state() -> dict[str, Any]:
        live: LiveEngine = state["live"]
        pool = engine.pool
        return {
            "model": serve.model,
            "speed": serve.speed,
            "sim_time_s": live.sim_now(),
            "engine_time_s": engine.now,
            "running": len(engine.running),
            "waiting": len(engine.waiting),
            "num_blocks": pool.num_blocks,
            "free_blocks": pool.num_free(),
            "cached_free_blocks": pool.num_cached_free(),
            "kv_usage": engine.kv_usage,
            "prefix_queries": engine.stats.prefix_queries,
            "prefix_hits": engine.stats.prefix_hits,
            "preemptions": engine.stats.preemptions,
            "sessions_in_system": live.sessions_in_system(),
        }

    @app.post("/sim/flush")
    async def sim_flush() -> dict[str, Any]:
        preempted = engine.flush()
        log.info("prefix cache flushed; %d running requests preempted", preempted)
        return {"flushed": True, "preempted": preempted}

    async def parse(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response("request body is not valid JSON", "BadRequestError", 400)
        if not isinstance(body, dict):
            return error_response("request body must be a JSON object", "BadRequestError", 400)
        model = body.get("model")
        if model is not None and model != serve.model:
            return error_response(f"The model `{model}` does not exist.", "NotFoundError", 404, "model")
        return body

    def make_request(prompt: str, body: dict[str, Any], kind: str) -> EngineRequest | JSONResponse:
        prompt_tokens = tokens_of_text(prompt)
        raw_max = body.get("max_completion_tokens", body.get("max_tokens"))
        if raw_max is not None and (isinstance(raw_max, bool) or not isinstance(raw_max, int) or raw_max < 1):
            return error_response(
                f"max_tokens must be a positive integer, got {raw_max!r}",
                "BadRequestError",
                400,
                "max_tokens",
            )
        if prompt_tokens + (raw_max or 0) > MAX_MODEL_LEN:
            return error_response(
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested "
                f"{prompt_tokens + (raw_max or 0)} tokens ({prompt_tokens} in the messages, {raw_max or 0} in "
                "the completion). Please reduce the length of the messages or completion.",
                "BadRequestError",
                400,
            )
        digest = hashlib.blake2b(f"{serve.seed}:{prompt}".encode(), digest_size=16).digest()
        natural = max(1, int(serve.default_output_tokens * (0.5 + random.Random(digest).random())))
        if raw_max is None:
            n, reason = natural, "stop"
        elif body.get("ignore_eos") or natural >= raw_max:
            n, reason = raw_max, "length"
        else:
            n, reason = natural, "stop"
        answer = answer_text(n, digest)
        content = TextContent(prompt + answer, engine.block_size)
        req = EngineRequest(
            id=f"{kind}-{uuid.uuid4().hex}",
            content=content,
            prompt_tokens=prompt_tokens,
            max_tokens=n,
            arrival=0.0,
            tag=answer,
            finish_reason=reason,
        )
        return req

    def usage(req: EngineRequest) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.output,
            "completion_tokens": req.output,
        }
        if serve.prompt_tokens_details:
            out["prompt_tokens_details"] = {"cached_tokens": int(req.cached_tokens or 0)}
        else:
            out["prompt_tokens_details"] = None
        return out

    async def run(req: EngineRequest, request: Request) -> JSONResponse | None:
        live: LiveEngine = state["live"]
        session = request.headers.get("x-session-id")
        live.touch_session(session, end=False)
        try:
            live.submit(req)
        except RequestTooLong as exc:
            return error_response(str(exc), "BadRequestError", 400)
        return None

    def end_session(request: Request) -> None:
        if request.headers.get("x-session-end", "").lower() in ("1", "true", "yes"):
            state["live"].touch_session(request.headers.get("x-session-id"), end=True)

    async def complete(req: EngineRequest, request: Request, chat: bool) -> Response:
        live: LiveEngine = state["live"]
        try:
            ok = await live.wait_done(req)
        except asyncio.CancelledError:
            live.abort(req)
            raise
        end_session(request)
        if not ok:
            return error_response("request aborted", "InternalServerError", 500)
        text = str(req.tag)
        created_s = int(time.time())
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "reasoning_content": None,
                    "tool_calls": [],
                },
                "logprobs": None,
                "finish_reason": req.finish_reason,
                "stop_reason": None,
            }
            body = {
                "id": f"chatcmpl-{req.id}",
                "object": "chat.completion",
                "created": created_s,
                "model": serve.model,
                "choices": [choice],
                "usage": usage(req),
                "prompt_logprobs": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": req.finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
            body = {
                "id": f"cmpl-{req.id}",
                "object": "text_completion",
                "created": created_s,
                "model": serve.model,
                "choices": [choice],
                "usage": usage(req),
            }
        return JSONResponse(body)

    def stream(req: EngineRequest, request: Request, chat: bool, include_usage: bool) -> StreamingResponse:
        live: LiveEngine = state["live"]
        created_s = int(time.time())
        rid = f"chatcmpl-{req.id}" if chat else f"cmpl-{req.id}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        text = str(req.tag)

        def chunk(delta_text: str | None, finish: str | None, role: bool = False) -> str:
            if chat:
                delta: dict[str, Any] = {}
                if role:
                    delta["role"] = "assistant"
                if delta_text is not None:
                    delta["content"] = delta_text
                choice: dict[str, Any] = {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": finish,
                }
            else:
                choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish}
            if finish is not None:
                choice["stop_reason"] = None
            payload = {
                "id": rid,
                "object": obj,
                "created": created_s,
                "model": serve.model,
                "choices": [choice],
            }
            return f"data: {json.dumps(payload)}\n\n"

        async def events() -> AsyncIterator[str]:
            sent = 0
            try:
                if chat:
                    yield chunk("", None, role=True)
                while True:
                    if req.status == ABORTED:
                        yield f"data: {json.dumps(error_body('request aborted', 'InternalServerError', 500))}\n\n"
                        return
                    now = live.sim_now()
                    done = req.status == FINISHED and now >= (req.finish_time or 0.0)
                    first_due = req.first_token_time is not None and now >= req.first_token_time
                    if done:
                        visible = req.max_tokens
                    elif first_due:
                        visible = min(req.output, req.max_tokens - 1)
                    else:
                        visible = 0
                    if visible > sent:
                        piece = text[sent * CHARS_PER_TOKEN : visible * CHARS_PER_TOKEN]
                        sent = visible
                        if done:
                            yield chunk(piece, req.finish_reason)
                            break
                        yield chunk(piece, None)
                    elif done:
                        yield chunk("", req.finish_reason)
                        break
                    await live.wait_change(req, first_seen=first_due, timeout=STREAM_INTERVAL_S)
                if include_usage:
                    payload = {
                        "id": rid,
                        "object": obj,
                        "created": created_s,
                        "model": serve.model,
                        "choices": [],
                        "usage": usage(req),
                    }
                    yield f"data: {json.dumps(payload)}\n\n"
                yield "data: [DONE]\n\n"
                end_session(request)
            finally:
                if req.status not in (FINISHED, ABORTED):
                    live.abort(req)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def handle(request: Request, chat: bool) -> Response:
        body = await parse(request)
        if isinstance(body, JSONResponse):
            return body
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return error_response("messages must be a non-empty list", "BadRequestError", 400, "messages")
            prompt = render_chat(messages)
        else:
            raw = body.get("prompt")
            if isinstance(raw, list):
                raw = raw[0] if raw and isinstance(raw[0], str) else " ".join(str(x) for x in raw)
            if not isinstance(raw, str) or not raw:
                return error_response("prompt must be a non-empty string", "BadRequestError", 400, "prompt")
            prompt = raw
        req = make_request(prompt, body, "chat" if chat else "cmpl")
        if isinstance(req, JSONResponse):
            return req
        failed = await run(req, request)
        if failed is not None:
            return failed
        if body.get("stream"):
            opts = body.get("stream_options") or {}
            return stream(req, request, chat, bool(opts.get("include_usage")))
        return await complete(req, request, chat)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return error_response(f"Not Found: {request.url.path}", "NotFoundError", 404)

    return app


def serve_main(
    host: str,
    port: int,
    engine_config: EngineConfig,
    serve: ServeConfig,
    cost: CostModel | None = None,
    log_level: str = "info",
) -> None:
    import uvicorn

    app = create_app(engine_config, cost, serve)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
