"""Live RAG traffic of the offline ``rag-storm`` preset, for the load generator (``loadgen --rag-preset``).

The same workload the compaction experiment runs offline (``simulator.offline``'s
``rag-storm`` scenario, ``simulator.config.RagWorkload``), sent as chat
completions through the sidecar, with rates and times scaled by ``--speed``
(simulated seconds per wall second):

* document-set requests (Poisson, ``rag_rate``): a short preamble shared by all
  RAG traffic, then the system prompt and one of ``doc_sets`` document sets
  (Zipf ``doc_zipf``) named with ``X-Prefix-Id: rag-docs-N``, then a unique
  question; ``cold_fraction`` of them share nothing;
* a storm (``storm_rate`` for ``storm_minutes`` from ``storm_start_min``, then
  again every ``--rag-storm-every`` wall seconds if set): heterogeneous
  retrievals that share only the preamble, so the request-weighted hit rate
  stays high while the token-weighted one falls (the thin-reuse regime);
* the compaction job: every ``compaction_every`` requests every document set
  becomes due; every ``compaction_check_s`` the job asks the sidecar's gate
  (``POST /compaction/requests``, one subtree per request, as the offline gated
  job does) and rewrites the granted document sets (a new version of their
  text, so their cached blocks stop matching). Deferred sets stay due.

Text sizes are simulator tokens (4 characters each), made by ``content.filler``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Any

import httpx

from simulator.config import RagWorkload, apply_overrides, parse_set_args
from simulator.content import filler
from simulator.offline import scenario_config
from simulator.rag import _zipf_weights

log = logging.getLogger("simulator.loadgen")
MAX_LAG_S = 1.0


def rag_preset(overrides: list[str]) -> RagWorkload:
    """The ``rag-storm`` scenario's workload with ``--rag-set KEY=VALUE`` overrides (same keys as ``--set``)."""
    return apply_overrides(scenario_config("rag-storm"), parse_set_args(overrides)).rag


class RagPresetTraffic:
    """The preset's traffic and compaction job, sent through ``gen`` (a ``simulator.loadgen.LoadGenerator``:
    its client, target, headers, counters and stop event)."""

    def __init__(self, gen: Any, preset: RagWorkload, speed: float, storm_every: float) -> None:
        self.gen = gen
        self.r = preset
        self.speed = speed
        self.storm_every = storm_every
        self.rng = random.Random(f"rag-{gen.run_id}")
        self.weights = _zipf_weights(preset.doc_sets, preset.doc_zipf)
        self.head = "Answer from the documents. " + filler(
            random.Random("rag-head"), preset.rag_head_tokens - 7
        )
        self.system_rest = filler(
            random.Random("rag-system"), preset.rag_system_tokens - preset.rag_head_tokens
        )
        self.versions = [0] * preset.doc_sets
        self._docs: dict[tuple[int, int], str] = {}
        self.due: set[int] = set()
        self.since = 0
        self.n = 0
        self.granted = 0
        self.deferred = 0
        self.tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ text
    def doc_text(self, d: int) -> str:
        key = (d, self.versions[d])
        text = self._docs.get(key)
        if text is None:
            text = filler(random.Random(f"doc-{self.gen.run_id}-{d}-v{key[1]}"), self.r.doc_tokens)
            self._docs = {k: v for k, v in self._docs.items() if k[0] != d or k[1] == key[1]}
            self._docs[key] = text
        return text

    def body(self, kind: str, n: int) -> tuple[dict[str, Any], dict[str, str]]:
        r = self.r
        unique = random.Random(f"q-{self.gen.run_id}-{n}")
        headers: dict[str, str] = {}
        cold = self.rng.random() < (r.cold_fraction if kind == "doc" else r.storm_cold_fraction)
        if kind == "doc":
            size, out = r.rag_system_tokens + r.doc_tokens + r.suffix_tokens, r.rag_output_tokens
            if cold:
                system = filler(unique, r.rag_system_tokens + r.doc_tokens)
            else:
                d = self.rng.choices(range(r.doc_sets), self.weights)[0]
                system = self.head + self.system_rest + self.doc_text(d)
                headers["X-Prefix-Id"] = f"rag-docs-{d}"
            question = filler(unique, r.suffix_tokens)
        else:
            size, out = r.rag_head_tokens + r.storm_query_tokens, r.storm_output_tokens
            # a distinct retrieval below the shared preamble (or, when cold, nothing shared at all)
            system = filler(unique, r.rag_head_tokens) if cold else self.head
            question = filler(unique, size - r.rag_head_tokens)
        body = {
            "model": self.gen.model,
            "max_tokens": out,
            "stream": False,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Question {n}: {question}"},
            ],
        }
        return body, headers

    # ------------------------------------------------------------ traffic
    def storm_on(self, elapsed: float) -> bool:
        start = self.r.storm_start_min * 60 / self.speed
        length = self.r.storm_minutes * 60 / self.speed
        if elapsed < start:
            return False
        into = elapsed - start
        if self.storm_every > 0:
            into %= self.storm_every
        return into < length

    async def arrivals(self, kind: str) -> None:
        gen = self.gen
        rate = (self.r.rag_rate if kind == "doc" else self.r.storm_rate) * self.speed
        if rate <= 0:
            return
        due_at = time.monotonic()
        lagging = False
        while not gen.stopping.is_set():
            # arrival times on an absolute schedule, so slow wake-ups do not thin the process out; a generator
            # more than MAX_LAG_S behind (a starved CPU) drops the arrivals it missed rather than spiral
            due_at += self.rng.expovariate(rate)
            if due_at < time.monotonic() - MAX_LAG_S:
                if not lagging:
                    log.warning(
                        "RAG %s arrivals are over %g s behind: dropping the missed ones (too slow a "
                        "machine for --speed %g)",
                        kind,
                        MAX_LAG_S,
                        self.speed,
                    )
                lagging = True
                due_at = time.monotonic() - MAX_LAG_S
            delay = due_at - time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                # always yield, so the stop event and the requests in flight get their turn
                await asyncio.wait_for(gen.stopping.wait(), max(0.0, delay))
            if gen.stopping.is_set():
                break
            if kind == "storm" and not self.storm_on(due_at - gen.t0):
                continue
            self.n += 1
            body, headers = self.body(kind, self.n)
            task = asyncio.get_running_loop().create_task(self.one(body, headers, kind, self.n))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            self.count_request()

    async def one(self, body: dict[str, Any], headers: dict[str, str], kind: str, n: int) -> None:
        gen = self.gen
        try:
            result = await gen.post_chat(body, gen.headers(headers))
        except (httpx.HTTPError, RuntimeError, ValueError, KeyError) as exc:
            gen.counters.errors += 1
            log.warning(
                "rag %s request %d failed: %s",
                kind,
                n,
                (str(exc) or type(exc).__name__).splitlines()[0][:200],
            )
            return
        gen.counters.rag_requests += 1
        gen.record(result["usage"])

    # ------------------------------------------------------------ the compaction job
    def count_request(self) -> None:
        self.since += 1
        if self.since >= self.r.compaction_every:
            self.since = 0
            self.due.update(range(self.r.doc_sets))

    async def compaction_job(self) -> None:
        gen = self.gen
        while not gen.stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(gen.stopping.wait(), self.r.compaction_check_s / self.speed)
            if gen.stopping.is_set():
                break
            for d in sorted(self.due):
                await self.ask_gate(d)

    async def ask_gate(self, d: int) -> None:
        gen = self.gen
        subtree = f"rag-docs-{d}"
        try:
            r = await gen.client.post(
                f"{gen.cfg.target}/compaction/requests",
                headers=gen.headers({}),
                timeout=10.0,
                json={
                    "subtrees": [subtree],
                    "reason": f"housekeeping: {self.r.compaction_every} requests since the last job",
                },
            )
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:160]!r}")
            granted = subtree in (r.json().get("granted") or [])
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            gen.counters.errors += 1
            log.warning(
                "compaction request for %s failed: %s", subtree, (str(exc) or type(exc).__name__)[:200]
            )
            return
        if granted:
            self.versions[d] += 1
            self.due.discard(d)
            self.granted += 1
        else:
            self.deferred += 1

    async def run(self) -> None:
        r = self.r
        log.info(
            "RAG traffic (rag-storm preset, speed %g): %.3g document requests/s, a storm of %.3g requests/s "
            "for %.0f s from %.0f s%s; compaction due every %d requests, gate asked every %.1f s",
            self.speed,
            r.rag_rate * self.speed,
            r.storm_rate * self.speed,
            r.storm_minutes * 60 / self.speed,
            r.storm_start_min * 60 / self.speed,
            f", again every {self.storm_every:g} s" if self.storm_every > 0 else "",
            r.compaction_every,
            r.compaction_check_s / self.speed,
        )
        loop = asyncio.get_running_loop()
        helpers = [
            loop.create_task(self.arrivals("doc")),
            loop.create_task(self.arrivals("storm")),
            loop.create_task(self.compaction_job()),
        ]
        try:
            await asyncio.gather(*helpers)
        finally:
            for t in [*helpers, *self.tasks]:
                t.cancel()
            await asyncio.gather(*helpers, *self.tasks, return_exceptions=True)
            log.info(
                "RAG traffic stopped: %d requests, compactions granted %d, deferred %d",
                self.n,
                self.granted,
                self.deferred,
            )
