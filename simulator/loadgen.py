"""``python -m simulator loadgen``: demo traffic of closed-loop agent sessions through the sidecar.

Each session sends turn k through the OpenAI chat API with ``X-Session-Id``,
waits for the answer, waits a tool latency, then sends turn k+1 whose messages
are the whole previous turn (including the assistant's answer) plus new tool
output; all sessions share one system prompt. The last turn carries
``X-Session-End: true``. Sessions arrive as a Poisson process (wall clock) up to
``--max-sessions`` at a time; about half of the turns stream (with
``stream_options.include_usage``), the rest do not.

Optional RAG traffic (``--rag-rate``): open-loop requests sharing document-set
prefixes, named with ``X-Prefix-Id: rag-docs-N``. ``--rag-preset`` sends the
offline ``rag-storm`` preset instead (document traffic, storms, and the
compaction job asking the sidecar's gate): see ``simulator.rag_traffic``.

``--speed`` divides tool latency (use the engine's ``--speed`` so the demo shows
minutes of agent behaviour in seconds). Errors and 503s from the sidecar are
logged as one line each and the turn is retried with back-off; nothing here
crashes the generator. Text sizes are in tokens of the simulator (4 chars each).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from simulator.content import filler

log = logging.getLogger("simulator.loadgen")
logging.getLogger("httpx").setLevel(logging.WARNING)


@dataclass
class LoadgenConfig:
    target: str = "http://127.0.0.1:8100"
    sessions_per_s: float = 0.3
    max_sessions: int = 8
    speed: float = 4.0
    seed: int | None = None
    duration: float = 0.0
    turns: int = 20
    system_prompt_tokens: int = 2000
    initial_context: int = 4600
    context_growth: int = 1000
    output_tokens: int = 200
    tool_latency: float = 3.0
    stream_fraction: float = 0.5
    rag_rate: float = 0.0
    rag_doc_sets: int = 4
    rag_doc_tokens: int = 5000
    rag_suffix_tokens: int = 300
    rag_preset: bool = False
    rag_storm_every: float = 0.0
    rag_set: list[str] = field(default_factory=list)
    burst_at: float = -1.0
    burst_seconds: float = 30.0
    burst_rate: float = 0.5
    model: str | None = None
    api_key: str | None = None
    timeout: float = 600.0
    max_retries: int = 8
    report_every: float = 10.0
    extra_headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sessions_per_s < 0:
            raise ValueError(f"--sessions-per-s must be >= 0, got {self.sessions_per_s}")
        if self.max_sessions < 1:
            raise ValueError(f"--max-sessions must be >= 1, got {self.max_sessions}")
        if self.speed <= 0:
            raise ValueError(f"--speed must be > 0, got {self.speed}")
        if self.turns < 1:
            raise ValueError(f"--turns must be >= 1, got {self.turns}")
        if self.context_growth <= self.output_tokens:
            raise ValueError("--context-growth must exceed --output-tokens")
        if not 0 <= self.stream_fraction <= 1:
            raise ValueError(f"--stream-fraction must be in [0, 1], got {self.stream_fraction}")
        if self.rag_storm_every < 0:
            raise ValueError(f"--rag-storm-every must be >= 0, got {self.rag_storm_every}")
        if self.rag_preset:
            from simulator.rag_traffic import rag_preset

            rag_preset(self.rag_set)  # a bad --rag-set fails here, naming the key

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadgenConfig:
        return cls(
            target=args.target.rstrip("/"),
            sessions_per_s=args.sessions_per_s,
            max_sessions=args.max_sessions,
            speed=args.speed,
            seed=args.seed,
            duration=args.duration,
            turns=args.turns,
            initial_context=args.initial_context,
            context_growth=args.context_growth,
            output_tokens=args.output_tokens,
            tool_latency=args.tool_latency,
            stream_fraction=args.stream_fraction,
            rag_rate=args.rag_rate,
            rag_doc_sets=args.rag_doc_sets,
            rag_preset=args.rag_preset,
            rag_storm_every=args.rag_storm_every,
            rag_set=list(args.rag_set),
            burst_at=args.burst_at,
            burst_seconds=args.burst_seconds,
            burst_rate=args.burst_rate,
            model=args.model,
            api_key=args.api_key,
        )


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = LoadgenConfig()
    p.add_argument("--target", default=d.target, help="sidecar (or engine) base URL")
    p.add_argument(
        "--sessions-per-s", type=float, default=d.sessions_per_s, help="new sessions per wall second"
    )
    p.add_argument("--max-sessions", type=int, default=d.max_sessions, help="sessions open at once (cap)")
    p.add_argument("--speed", type=float, default=d.speed, help="divides tool latency; match the engine's")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--duration", type=float, default=0.0, help="wall seconds to run (0: until stopped)")
    p.add_argument("--turns", type=int, default=d.turns)
    p.add_argument("--initial-context", type=int, default=d.initial_context)
    p.add_argument("--context-growth", type=int, default=d.context_growth)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    p.add_argument("--tool-latency", type=float, default=d.tool_latency, help="mean, simulated seconds")
    p.add_argument("--stream-fraction", type=float, default=d.stream_fraction)
    p.add_argument("--rag-rate", type=float, default=0.0, help="RAG requests per wall second (0: off)")
    p.add_argument("--rag-doc-sets", type=int, default=d.rag_doc_sets)
    p.add_argument(
        "--rag-preset",
        action="store_true",
        help="RAG traffic of the offline rag-storm preset, scaled by --speed: document-set requests, "
        "a storm, and the compaction job asking the sidecar's gate (see simulator/rag_traffic.py)",
    )
    p.add_argument(
        "--rag-storm-every",
        type=float,
        default=0.0,
        help="with --rag-preset: wall seconds between storm starts (0: one storm)",
    )
    p.add_argument(
        "--rag-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --rag-preset: override a setting of the preset (the offline --set keys)",
    )
    p.add_argument(
        "--burst-at", type=float, default=-1.0, help="wall second of a burst of arrivals (<0: none)"
    )
    p.add_argument("--burst-seconds", type=float, default=d.burst_seconds)
    p.add_argument("--burst-rate", type=float, default=d.burst_rate, help="extra sessions/s during the burst")
    p.add_argument("--model", default=None, help="model name (default: the target's first /v1/models entry)")
    p.add_argument("--api-key", default=None, help="sent as Authorization: Bearer")


@dataclass
class Counters:
    started: int = 0
    finished: int = 0
    turns: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    rag_requests: int = 0
    active: int = 0


class LoadGenerator:
    def __init__(self, cfg: LoadgenConfig, client: httpx.AsyncClient) -> None:
        self.cfg = cfg
        self.client = client
        self.rng = random.Random(cfg.seed)
        self.run_id = (
            uuid.UUID(int=self.rng.getrandbits(128)).hex[:8] if cfg.seed is not None else uuid.uuid4().hex[:8]
        )
        self.system_prompt = "You are a coding agent. " + filler(
            random.Random(f"system-{cfg.seed}"), cfg.system_prompt_tokens - 6
        )
        self.model = cfg.model or "sim/agent-8b"
        self.counters = Counters()
        self.stopping = asyncio.Event()
        self.slots = asyncio.Semaphore(cfg.max_sessions)
        self.t0 = time.monotonic()

    def headers(self, extra: dict[str, str]) -> dict[str, str]:
        h = dict(self.cfg.extra_headers)
        if self.cfg.api_key:
            h["Authorization"] = f"Bearer {self.cfg.api_key}"
        h.update(extra)
        return h

    async def discover_model(self) -> None:
        if self.cfg.model:
            return
        try:
            r = await self.client.get(f"{self.cfg.target}/v1/models", headers=self.headers({}), timeout=5.0)
            if r.status_code == 200:
                data = r.json().get("data") or []
                if data:
                    self.model = data[0]["id"]
                    return
            log.warning("GET /v1/models answered HTTP %d; using model %s", r.status_code, self.model)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            log.warning("GET /v1/models failed (%s); using model %s", type(exc).__name__, self.model)

    async def post_chat(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """One chat completion; returns usage. Raises RuntimeError with a one-line reason on failure."""
        url = f"{self.cfg.target}/v1/chat/completions"
        if not body.get("stream"):
            r = await self.client.post(url, json=body, headers=headers, timeout=self.cfg.timeout)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:160]!r}")
            data = r.json()
            answer = data["choices"][0]["message"].get("content") or ""
            return {"usage": data.get("usage") or {}, "answer": answer}
        answer_parts: list[str] = []
        usage: dict[str, Any] = {}
        async with self.client.stream("POST", url, json=body, headers=headers, timeout=self.cfg.timeout) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                raise RuntimeError(f"HTTP {r.status_code}: {text[:160]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    raise RuntimeError(f"stream error: {chunk['error'].get('message')}")
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        answer_parts.append(piece)
        return {"usage": usage, "answer": "".join(answer_parts)}

    async def request_with_retries(
        self, body: dict[str, Any], headers: dict[str, str], what: str
    ) -> dict[str, Any] | None:
        delay = 0.5
        for attempt in range(1, self.cfg.max_retries + 1):
            if self.stopping.is_set():
                return None
            try:
                return await self.post_chat(body, headers)
            except (httpx.HTTPError, RuntimeError, ValueError, KeyError) as exc:
                self.counters.errors += 1
                reason = str(exc) or type(exc).__name__
                log.warning("%s attempt %d failed: %s", what, attempt, reason.splitlines()[0][:200])
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), delay)
                delay = min(delay * 2, 10.0)
        log.warning("%s abandoned after %d attempts", what, self.cfg.max_retries)
        return None

    def record(self, usage: dict[str, Any]) -> None:
        c = self.counters
        c.turns += 1
        prompt = int(usage.get("prompt_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        c.prompt_tokens += prompt
        c.cached_tokens += int(details.get("cached_tokens") or 0)

    async def session(self, n: int) -> None:
        cfg = self.cfg
        sid = f"lg-{self.run_id}-{n}"
        rng = random.Random(f"{self.run_id}-{n}")
        c = self.counters
        c.started += 1
        c.active += 1
        try:
            first_user = filler(rng, cfg.initial_context - cfg.system_prompt_tokens)
            messages: list[dict[str, str]] = [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"Task {sid}: {first_user}"},
            ]
            for turn in range(1, cfg.turns + 1):
                last = turn == cfg.turns
                headers = self.headers({"X-Session-Id": sid})
                if last:
                    headers["X-Session-End"] = "true"
                stream = rng.random() < cfg.stream_fraction
                body: dict[str, Any] = {
                    "model": self.model,
                    "messages": messages,
                    "max_tokens": cfg.output_tokens,
                    "stream": stream,
                }
                if stream:
                    body["stream_options"] = {"include_usage": True}
                result = await self.request_with_retries(body, headers, f"session {sid} turn {turn}")
                if result is None:
                    return
                self.record(result["usage"])
                if last:
                    break
                messages = [
                    *messages,
                    {"role": "assistant", "content": result["answer"]},
                    {"role": "user", "content": filler(rng, cfg.context_growth - cfg.output_tokens)},
                ]
                think = rng.lognormvariate(0.0, 0.5) * cfg.tool_latency / 1.133 / cfg.speed
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), think)
                if self.stopping.is_set():
                    return
            c.finished += 1
        finally:
            c.active -= 1
            self.slots.release()

    def arrival_rate(self, elapsed: float) -> float:
        rate = self.cfg.sessions_per_s
        if (
            self.cfg.burst_at >= 0
            and self.cfg.burst_at <= elapsed < self.cfg.burst_at + self.cfg.burst_seconds
        ):
            rate += self.cfg.burst_rate
        return rate

    async def arrivals(self, tasks: set[asyncio.Task[None]]) -> None:
        n = 0
        while not self.stopping.is_set():
            rate = self.arrival_rate(time.monotonic() - self.t0)
            wait = self.rng.expovariate(rate) if rate > 0 else 1.0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), min(wait, 5.0) if rate > 0 else 1.0)
            if self.stopping.is_set() or rate <= 0:
                continue
            await self.slots.acquire()
            if self.stopping.is_set():
                self.slots.release()
                break
            n += 1
            task = asyncio.get_running_loop().create_task(self.session(n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def rag(self) -> None:
        cfg = self.cfg
        docs = [
            filler(random.Random(f"doc-{cfg.seed}-{d}"), cfg.rag_doc_tokens) for d in range(cfg.rag_doc_sets)
        ]
        system = "Answer from the documents. " + filler(random.Random("rag-system"), 1000)
        n = 0
        while not self.stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.rng.expovariate(cfg.rag_rate))
            if self.stopping.is_set():
                break
            n += 1
            d = min(int(self.rng.paretovariate(1.2)) - 1, cfg.rag_doc_sets - 1)
            question = filler(random.Random(f"q-{self.run_id}-{n}"), cfg.rag_suffix_tokens)
            body = {
                "model": self.model,
                "max_tokens": 100,
                "stream": False,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"{docs[d]}\nQuestion {n}: {question}"},
                ],
            }
            headers = self.headers({"X-Prefix-Id": f"rag-docs-{d}"})
            asyncio.get_running_loop().create_task(self._rag_one(body, headers, n))

    async def _rag_one(self, body: dict[str, Any], headers: dict[str, str], n: int) -> None:
        try:
            result = await self.post_chat(body, headers)
        except (httpx.HTTPError, RuntimeError, ValueError, KeyError) as exc:
            self.counters.errors += 1
            log.warning(
                "rag request %d failed: %s", n, (str(exc) or type(exc).__name__).splitlines()[0][:200]
            )
            return
        self.counters.rag_requests += 1
        self.record(result["usage"])

    async def reporter(self) -> None:
        last_turns = 0
        last_t = time.monotonic()
        while not self.stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.cfg.report_every)
            c = self.counters
            now = time.monotonic()
            rate = (c.turns - last_turns) / max(now - last_t, 1e-9)
            last_turns, last_t = c.turns, now
            hit = c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0
            log.info(
                "sessions active %d started %d finished %d | turns %d (%.2f/s) | cached %.2f | errors %d",
                c.active,
                c.started,
                c.finished,
                c.turns,
                rate,
                hit,
                c.errors,
            )

    async def run(self) -> None:
        await self.discover_model()
        log.info(
            "load generator -> %s model %s: %.3g sessions/s, at most %d open, %d turns, speed %.3g",
            self.cfg.target,
            self.model,
            self.cfg.sessions_per_s,
            self.cfg.max_sessions,
            self.cfg.turns,
            self.cfg.speed,
        )
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        helpers = [loop.create_task(self.arrivals(tasks)), loop.create_task(self.reporter())]
        if self.cfg.rag_rate > 0:
            helpers.append(loop.create_task(self.rag()))
        if self.cfg.rag_preset:
            from simulator.rag_traffic import RagPresetTraffic, rag_preset

            traffic = RagPresetTraffic(
                self, rag_preset(self.cfg.rag_set), self.cfg.speed, self.cfg.rag_storm_every
            )
            helpers.append(loop.create_task(traffic.run()))
        if self.cfg.duration > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.cfg.duration)
            self.stopping.set()
        else:
            await self.stopping.wait()
        for t in [*helpers, *tasks]:
            t.cancel()
        await asyncio.gather(*helpers, *tasks, return_exceptions=True)
        c = self.counters
        log.info(
            "stopped: %d sessions started, %d finished, %d turns, %d errors",
            c.started,
            c.finished,
            c.turns,
            c.errors,
        )


async def _main(cfg: LoadgenConfig) -> None:
    rag = 256 if cfg.rag_preset else 0  # the storm's requests are concurrent
    limits = httpx.Limits(
        max_connections=cfg.max_sessions * 2 + 64 + rag, max_keepalive_connections=cfg.max_sessions + 8 + rag
    )
    async with httpx.AsyncClient(limits=limits) as client:
        gen = LoadGenerator(cfg, client)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, gen.stopping.set)
        await gen.run()


def run_loadgen(cfg: LoadgenConfig) -> int:
    asyncio.run(_main(cfg))
    return 0


def loadgen_command(args: argparse.Namespace) -> int:
    try:
        cfg = LoadgenConfig.from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run_loadgen(cfg)
