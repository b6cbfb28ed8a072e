"""A minimal stub engine speaking vLLM's OpenAI-compatible and Prometheus protocols.

Test support (moved out of the sidecar package), for the sidecar's tests and benchmark only (the
project's real engine model is the
simulator). It is a raw asyncio HTTP/1.1 server (keep-alive, no framework), so the
benchmark measures the sidecar, not the stub.

- ``POST /v1/chat/completions``, ``POST /v1/completions``: OpenAI shape, streaming
  (server-sent events; a usage-only final chunk when ``stream_options.include_usage``)
  and not. Tokens are ``ceil(chars / 4)``. Cached tokens come from a tiny prefix
  cache: prompts are cut into 64-character blocks with chained hashes; leading
  blocks seen before are cached (16 tokens each). ``--no-cached-report`` omits
  ``prompt_tokens_details`` (like vLLM without ``--enable-prompt-tokens-details``).
- ``GET /v1/models``; an unknown ``model`` gets vLLM's 404 error.
- ``GET /metrics``: ``vllm:cache_config_info`` with the pool size.
- Test hooks: header ``x-stub-status: 500`` answers that status; ``x-stub-delay-ms``
  delays the answer; ``x-stub-wait-for: NAME`` holds the answer until an in-process test sets
  ``engine.gate(NAME)`` (an event, so a test waits for a condition, not for a duration); ``x-stub-usage: {json}`` reports that usage (non-streaming); ``x-stub-chunk-delay-ms`` paces stream chunks; ``x-stub-break: 1`` breaks a
  stream off midway.

Run: ``python -m tests.stubs.stub_engine --port 8000 [--pool-tokens 400000] [--delay-ms 0]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import time
from collections import OrderedDict
from typing import Any

MODEL = "stub-model"
BLOCK_CHARS = 64
BLOCK_TOKENS = 16


class StubEngine:
    def __init__(
        self,
        pool_tokens: int = 400_000,
        cached_report: bool = True,
        delay_s: float = 0.0,
        completion_tokens: int = 8,
        model: str = MODEL,
        metrics: bool = True,
        max_model_len: int | None = 131072,
    ) -> None:
        self.pool_tokens = pool_tokens
        self.cached_report = cached_report
        self.delay_s = delay_s
        self.completion_tokens = completion_tokens
        self.model = model
        self.metrics = metrics
        self.max_model_len = max_model_len  # None: /v1/models does not report a context length
        self.blocks: OrderedDict[bytes, None] = OrderedDict()
        self.max_blocks = max(1, pool_tokens // BLOCK_TOKENS)
        self.requests = 0
        self.metrics_status = 200
        self.seen_headers: list[dict[str, str]] = []
        self.seen_bodies: list[dict[str, Any]] = []
        self.gates: dict[str, asyncio.Event] = {}

    def gate(self, name: str) -> asyncio.Event:
        """The event that answers sent with ``x-stub-wait-for: name`` wait for; set it to let them go."""
        return self.gates.setdefault(name, asyncio.Event())

    # ------------------------------------------------------------ model
    def cached_prefix_tokens(self, text: str) -> tuple[int, int]:
        prompt_tokens = max(1, math.ceil(len(text) / 4))
        digest = b""
        cached_blocks = 0
        still_cached = True
        for start in range(0, len(text) - BLOCK_CHARS + 1, BLOCK_CHARS):
            digest = hashlib.blake2b(
                digest + text[start : start + BLOCK_CHARS].encode(), digest_size=8
            ).digest()
            if still_cached and digest in self.blocks:
                cached_blocks += 1
                self.blocks.move_to_end(digest)
            else:
                still_cached = False
                self.blocks[digest] = None
                if len(self.blocks) > self.max_blocks:
                    self.blocks.popitem(last=False)
        return prompt_tokens, min(prompt_tokens, cached_blocks * BLOCK_TOKENS)

    @staticmethod
    def prompt_text(body: dict[str, Any]) -> str:
        if isinstance(body.get("messages"), list):
            parts = []
            for m in body["messages"]:
                if isinstance(m, dict):
                    c = m.get("content")
                    parts.append(f"<{m.get('role')}>" + (c if isinstance(c, str) else json.dumps(c)))
            return "".join(parts)
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else json.dumps(prompt)

    def usage(self, prompt: int, cached: int, completion: int) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.cached_report:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    # ------------------------------------------------------------- http
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(length) if length else b""
                keep_alive = headers.get("connection", "").lower() != "close"
                await self.route(method, path, headers, body, writer)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    def respond(
        writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str = "application/json"
    ) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(
            status, "X"
        )
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )

    async def route(
        self, method: str, path: str, headers: dict[str, str], raw: bytes, writer: asyncio.StreamWriter
    ) -> None:
        path = path.split("?", 1)[0]
        if method == "GET" and path == "/metrics":
            if self.metrics_status != 200:  # test hook: an engine whose /metrics cannot be read
                self.respond(writer, self.metrics_status, b"metrics unavailable", "text/plain")
                return
            text = (
                "# HELP vllm:num_requests_running Running requests.\n# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} 0.0\n'
            )
            if self.metrics:
                blocks = self.pool_tokens // 16
                text += (
                    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                    "# TYPE vllm:cache_config_info gauge\n"
                    f'vllm:cache_config_info{{block_size="16",engine="0",enable_prefix_caching="True",'
                    f'kv_cache_size_tokens="{self.pool_tokens}",num_gpu_blocks="{blocks}"}} 1.0\n'
                )
            self.respond(writer, 200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            return
        if method == "GET" and path == "/v1/models":
            models: dict[str, Any] = {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "stub",
                        "root": self.model,
                    }
                ],
            }
            if self.max_model_len is not None:
                models["data"][0]["max_model_len"] = self.max_model_len
            self.respond(writer, 200, json.dumps(models).encode())
            return
        if method == "GET" and path == "/health":
            self.respond(writer, 200, b"")
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            self.respond(writer, 404, json.dumps({"detail": "Not Found"}).encode())
            return
        self.requests += 1
        if len(self.seen_headers) < 1000:
            self.seen_headers.append(headers)
        status_hook = headers.get("x-stub-status")
        if status_hook:
            self.respond(
                writer,
                int(status_hook),
                json.dumps(
                    {
                        "error": {
                            "message": "stub failure",
                            "type": "InternalServerError",
                            "param": None,
                            "code": int(status_hook),
                        }
                    }
                ).encode(),
            )
            return
        try:
            body: Any = json.loads(raw)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            self.respond(
                writer,
                400,
                json.dumps(
                    {
                        "error": {
                            "message": "invalid JSON body",
                            "type": "BadRequestError",
                            "param": None,
                            "code": 400,
                        }
                    }
                ).encode(),
            )
            return
        if len(self.seen_bodies) < 1000:
            self.seen_bodies.append(body)
        model = body.get("model", self.model)
        if model != self.model:
            self.respond(
                writer,
                404,
                json.dumps(
                    {
                        "error": {
                            "message": f"The model `{model}` does not exist.",
                            "type": "NotFoundError",
                            "param": "model",
                            "code": 404,
                        }
                    }
                ).encode(),
            )
            return
        delay = float(headers.get("x-stub-delay-ms", 0) or 0) / 1000.0 or self.delay_s
        if delay:
            await asyncio.sleep(delay)
        if gate := headers.get("x-stub-wait-for"):
            await self.gate(gate).wait()
        prompt, cached = self.cached_prefix_tokens(self.prompt_text(body))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        n_out = self.completion_tokens
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
            n_out = min(n_out, max_tokens)
        chat = path == "/v1/chat/completions"
        created = int(time.time())
        rid = f"{'chatcmpl' if chat else 'cmpl'}-stub{self.requests}"
        words = ["tok"] * n_out
        if not body.get("stream"):
            text = " ".join(words)
            choice: dict[str, Any] = (
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                    "logprobs": None,
                }
                if chat
                else {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
            )
            usage = self.usage(prompt, cached, n_out)
            if headers.get("x-stub-usage"):  # a hostile engine's usage report, verbatim
                usage = json.loads(headers["x-stub-usage"])
            resp = {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            }
            self.respond(writer, 200, json.dumps(resp).encode())
            return
        include_usage = (
            isinstance(body.get("stream_options"), dict)
            and body["stream_options"].get("include_usage") is True
        )
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )

        def chunk(data: bytes) -> None:
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        obj = "chat.completion.chunk" if chat else "text_completion"
        chunk_delay = float(headers.get("x-stub-chunk-delay-ms", 0) or 0) / 1000.0
        extra = {"usage": None} if include_usage else {}
        for i, word in enumerate(words):
            if chat:
                delta: dict[str, Any] = {"content": ("" if i == 0 else " ") + word}
                if i == 0:
                    delta["role"] = "assistant"
                choice = {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": "length" if i == n_out - 1 else None,
                }
            else:
                choice = {
                    "index": 0,
                    "text": ("" if i == 0 else " ") + word,
                    "logprobs": None,
                    "finish_reason": "length" if i == n_out - 1 else None,
                }
            event: dict[str, Any] = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": self.model,
                "choices": [choice],
                **extra,
            }
            chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            if chunk_delay:
                await writer.drain()
                await asyncio.sleep(chunk_delay)
            if headers.get("x-stub-break") and i == n_out // 2:
                await writer.drain()
                writer.transport.abort()
                raise ConnectionError("stream broken on purpose")
        if include_usage:
            event = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": self.model,
                "choices": [],
                "usage": self.usage(prompt, cached, n_out),
            }
            chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
        chunk(b"data: [DONE]\n\n")
        chunk(b"")
        await writer.drain()


async def serve(engine: StubEngine, host: str, port: int) -> asyncio.Server:
    return await asyncio.start_server(engine.handle, host, port, backlog=4096, limit=1 << 24)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.stubs.stub_engine")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--pool-tokens", type=int, default=400_000)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--completion-tokens", type=int, default=8)
    p.add_argument("--no-cached-report", action="store_true")
    p.add_argument("--no-pool-metric", action="store_true")
    args = p.parse_args(argv)
    engine = StubEngine(
        args.pool_tokens,
        not args.no_cached_report,
        args.delay_ms / 1000.0,
        args.completion_tokens,
        metrics=not args.no_pool_metric,
    )

    async def run() -> None:
        server = await serve(engine, args.host, args.port)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()
