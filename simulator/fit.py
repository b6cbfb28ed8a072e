"""``python -m simulator fit``: fit the simulator's cost model and pool to a real engine.

Probes an OpenAI-compatible engine briefly (about a minute on the tiny CPU
model) and writes ``fit.json``:

* **prefill** against context: fresh prompts (distinct random words, so
  nothing is cached) of several sizes with ``max_tokens=1``, timed (below: "The engine's clock");
  least squares of ``t = c + alpha*n + beta*n^2/2`` (the simulator's
  attention-aware prefill of a chunk starting at 0, simulator/config.py
  ``CostModel``). The intercept ``c`` is free (``prefill_intercept_s`` in the
  file, not a cost-model setting): it holds the step overhead and what the
  engine's own clock does not see (an HTTP round trip, tokenisation), which,
  charged to ``alpha`` and ``beta`` instead, bent them: on a simulated engine
  at x10, where a 200-token prefill takes 0.3 ms and its round trip 1-2 ms,
  ``beta`` came out 0 on two of three fits. Extension probes add ``EXTEND_WORDS``
  new words after a cached prompt of ``EXTEND_BASES`` words (a turn's new
  text at the end of its context, where the forecast's recovered sessions
  prefill): the model of every probe is ``t = c + alpha*n + beta*n*(s + n/2)``
  with ``n`` new and ``s`` cached tokens (up to 7K words in all: within the
  largest fresh probe), and the offsets ``s`` separate
  ``beta`` from ``alpha`` where fresh prompts alone traded one for the other
  (``alpha`` 3.3-5.1e-6, ``beta`` 3.2-6.1e-10 over five fits of one
  simulated engine whose own are 3.24e-6 and 5.57e-10);
* **decode step** against batch and context: ``B`` concurrent requests of
  context ``C`` (cached first) answered with 8 and then with ``8 + S``
  tokens (``ignore_eos``); the difference of the two times over the ``S``
  steps, for ``(B, C)`` in 1-8 x 1K-4K words (``DECODE_PROBES``, up to 32K
  words of context in a step; ``decode_probes``: those whose batch fits in
  half the engine's pool, so that none is preempted); least squares of ``step = T0 + gamma * sum(ctx)``
  (``T0`` is the intercept here: the per-step overhead). ``S`` is 64, or
  more on a fast engine (``decode_steps``): enough steps that they take
  ``DECODE_SPAN_S``, so that the timing of an answer (an HTTP round trip, an
  engine loop's wake-up) is small against them. With 64 steps of a
  simulated engine at x10 (0.6-0.8 ms a step) that timing was as large as
  the steps' difference across contexts: the fit gave ``gamma`` 0 on two
  seeds and 8x the engine's on the third;
* **pool**: ``vllm:cache_config_info`` (``kv_cache_size_tokens``,
  ``block_size``) from the engine's /metrics.

**The engine's clock.** Each probe is timed twice: the wall time of its answer, and the engine's own
phase time (``simulator.engine_clock``: the growth of vLLM's ``request_prefill_time_seconds`` and
``request_decode_time_seconds`` across the probe, read from /metrics before and after it). The fit
uses the engine's clock when every probe of a kind has it (``"clock"`` in the file says which), else
the wall times: one clock for all, as their intercepts differ. On the wall clock, the HTTP round
trips and a machine busy with other work left the three fits of a simulated engine at x10 in the
forecast's validation with ``alpha`` 2-3% and ``beta`` 3-9% off the engine's own (docs/dashboard.md,
"Validation"); on the engine's clock the prefill terms are the engine's to four digits and ``gamma``
within 0.2%. A prompt longer than one step's token budget is prefilled in chunks, each a step with
its own ``T0`` (``prefill_chunks``, at the simulator's default budget, which the forecast's engine
uses too): the fit takes the decode fit's ``T0`` off each chunk after the first, which otherwise bent
``alpha`` and ``beta`` by 0.5-1%.

``fit.json["set"]`` maps simulator ``--set`` keys to the fitted values;
``simulator run --fit fit.json`` applies them before any ``--set`` of its own.
It also records the probes and the fit residuals, so the agreement of the
model with this engine can be read from the file.

``PRESETS`` are named workload settings for real-engine runs (``--preset`` on
``live-run`` and ``run``), so a live run and its simulated twin are given the
same sessions by name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from simulator.config import EngineConfig, SimConfigError
from simulator.content import words
from simulator.engine_clock import Totals, phase_mean, phase_totals

# Workloads scaled to the real CPU engine (docs/real-engine.md): minutes of wall time instead of 90
# simulated minutes, contexts within the tiny model's 16K. ``pool_tokens`` is the engine's pool
# (`python -m realengine serve --pool-tokens`, which scripts/engine/collapse-table.sh reads from here); a
# live run records the pool the engine reports. Calibrated with the engine pinned (docs/real-engine.md,
# "Calibration"): offered 1.2 turns/s lies between what the engine serves when every turn misses and
# when they hit, the healthy working set is a fraction of the pool, a burst of 22 sessions overflows it.
PRESETS: dict[str, dict[str, str]] = {
    "cpu-tiny": {
        "pool_tokens": "57344",
        "arrival_rate": "0.12",
        "burst_start_min": "1.0",
        "burst_minutes": "0.5",
        "burst_process": "uniform",
        "turns": "10",
        "system_prompt_tokens": "256",
        "initial_context": "5000",
        "context_growth": "500",
        "output_tokens": "16",
        "tool_latency_mean": "0.5",
        "tool_latency_sigma": "0.5",
        "output_budget": "16",
    },
}
# Settings a preset adds for one scenario only (the burst's size belongs to agent-burst; agent-steady has none).
SCENARIO_PRESETS: dict[str, dict[str, dict[str, str]]] = {
    "cpu-tiny": {"agent-burst": {"burst_rate": "0.733333"}},  # 22 sessions in the burst's half minute
}


def preset_overrides(name: str | None, scenario: str | None = None) -> dict[str, str]:
    """The ``--set`` values of preset ``name`` for ``scenario``."""
    if name is None:
        return {}
    if name not in PRESETS:
        raise SimConfigError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return {**PRESETS[name], **SCENARIO_PRESETS.get(name, {}).get(scenario or "", {})}


def least_squares(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Ordinary least squares (normal equations, small dense systems), coefficients >= 0 by clipping."""
    n = len(xs[0])
    ata = [[sum(r[i] * r[j] for r in xs) for j in range(n)] for i in range(n)]
    aty = [sum(r[i] * y for r, y in zip(xs, ys, strict=True)) for i in range(n)]
    # Gaussian elimination with partial pivoting
    m = [row[:] + [b] for row, b in zip(ata, aty, strict=True)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        if abs(m[col][col]) < 1e-30:
            continue
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col], strict=True)]
    return [max(0.0, m[i][n] / m[i][i]) if abs(m[i][i]) > 1e-30 else 0.0 for i in range(n)]


class Prober:
    def __init__(self, engine: str, model: str | None, rng: random.Random) -> None:
        self.engine = engine.rstrip("/")
        self.model = model
        self.rng = rng

    async def setup(self, client: httpx.AsyncClient) -> None:
        if self.model is None:
            self.model = (await client.get(f"{self.engine}/v1/models", timeout=30)).json()["data"][0]["id"]

    def prompt(self, n: int) -> list[dict[str, str]]:
        nonce = " ".join(str(self.rng.random()) for _ in range(2))
        return [{"role": "user", "content": f"{nonce} " + words(self.rng, n)}]

    async def prefill(self, client: httpx.AsyncClient, n: int) -> dict[str, float]:
        """A fresh prompt of ``n`` words, nothing cached."""
        return await self.timed(client, self.prompt(n))

    async def extend(self, client: httpx.AsyncClient, base: int, n: int) -> dict[str, float]:
        """``n`` new words after a cached prompt of ``base`` words: a turn's new text at the end of its context."""
        messages = self.prompt(base)
        await self.timed(client, messages)  # now cached
        more = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": words(self.rng, n)}]
        return await self.timed(client, messages + more)

    async def clock(self, client: httpx.AsyncClient) -> Totals:
        """The engine's phase-time totals now (`simulator.engine_clock`)."""
        return phase_totals((await client.get(f"{self.engine}/metrics", timeout=30)).text)

    async def phase_time(
        self, client: httpx.AsyncClient, before: Totals, phase: str, requests: int
    ) -> float | None:
        """Mean ``phase`` seconds of the ``requests`` requests finished since ``before``, by the engine's
        clock; None where the engine has no such histogram or something else ran beside them."""
        if phase not in before:
            return None
        for _ in range(CLOCK_READS):  # an engine may record a request's stats just after answering it
            mean = phase_mean(before, await self.clock(client), phase, requests)
            if mean is not None:
                return mean
            await asyncio.sleep(0.05)
        return None

    async def timed(self, client: httpx.AsyncClient, messages: list[dict[str, str]]) -> dict[str, Any]:
        before = await self.clock(client)
        t0 = time.perf_counter()
        r = await client.post(
            f"{self.engine}/v1/chat/completions",
            timeout=600,
            json={"model": self.model, "messages": messages, "max_tokens": 1},
        )
        dt = time.perf_counter() - t0
        r.raise_for_status()
        usage = r.json()["usage"]
        return {
            "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            "seconds": dt,
            "engine_s": await self.phase_time(client, before, "prefill", 1),
        }

    async def complete(
        self, client: httpx.AsyncClient, messages: list[dict[str, str]], tokens: int
    ) -> tuple[float, int]:
        """Seconds to the answer, and the prompt's tokens as the engine counted them."""
        body = {"model": self.model, "messages": messages, "max_tokens": tokens, "ignore_eos": True}
        t0 = time.perf_counter()
        r = await client.post(f"{self.engine}/v1/chat/completions", json=body, timeout=600)
        dt = time.perf_counter() - t0
        r.raise_for_status()
        return dt, int(r.json()["usage"]["prompt_tokens"])

    async def decode(
        self, client: httpx.AsyncClient, batch: int, ctx: int, short: int, long: int
    ) -> dict[str, float]:
        """Step time at ``batch`` x ``ctx``: the same B prompts (cached first, so both runs only hit) answered
        with ``short`` then ``long`` tokens at once; the difference of the slowest answers over
        ``long - short`` decode steps."""
        prompts = [self.prompt(ctx) for _ in range(batch)]
        warm = await asyncio.gather(*[self.complete(client, p, 1) for p in prompts])
        times, engine = {}, {}
        for tokens in (short, long):
            before = await self.clock(client)
            answers = await asyncio.gather(*[self.complete(client, p, tokens) for p in prompts])
            times[tokens] = max(t for t, _ in answers)
            engine[tokens] = await self.phase_time(client, before, "decode", batch)
        on_engine = None if None in engine.values() else (engine[long] - engine[short]) / (long - short)
        return {  # the context as the engine counted it (``ctx`` words are more tokens than that)
            "batch": batch,
            "ctx": sum(n for _, n in warm) / batch + (long + short) // 2,
            "step_s": max(0.0, (times[long] - times[short]) / (long - short)),
            "engine_step_s": None if on_engine is None else max(0.0, on_engine),
        }


EXTEND_BASES = (1024, 3072, 5120)  # words of cached context before the new text of an extension probe
EXTEND_WORDS = 2048
DECODE_PROBES = ((1, 1024), (4, 1024), (8, 1024), (1, 4096), (4, 4096), (8, 4096))  # (batch, context)
DECODE_SHORT = 8  # tokens of the short answer; the long one has the decode steps more
MIN_DECODE_STEPS = 64
MAX_DECODE_STEPS = 2048  # 4096 + 8 + 2048 tokens: within a 16K-context model
DECODE_SPAN_S = 1.0  # wall seconds the decode steps of a probe should take at least
CLOCK_READS = 5  # readings of /metrics, 50 ms apart, for a probe's phase times to appear


def decode_steps(step_s: float) -> int:
    """Decode steps per probe: ``MIN_DECODE_STEPS``, or as many as take ``DECODE_SPAN_S`` at ``step_s`` (the
    first probe's step), up to ``MAX_DECODE_STEPS``."""
    if step_s <= 0:
        return MAX_DECODE_STEPS
    return max(MIN_DECODE_STEPS, min(MAX_DECODE_STEPS, int(DECODE_SPAN_S / step_s) + 1))


def decode_probes(pool: int | None, steps: int) -> tuple[tuple[int, int], ...]:
    """The ``DECODE_PROBES`` whose batch fits in half the pool (``pool`` tokens; None: all), at 2 tokens a
    word: a probe that overflows the pool is preempted, and times recomputation, not decode steps."""
    if not pool:
        return DECODE_PROBES
    fits = tuple(p for p in DECODE_PROBES if p[0] * (2 * p[1] + DECODE_SHORT + steps) <= pool // 2)
    return fits or DECODE_PROBES[:1]


def prefill_seconds(p: dict[str, Any]) -> float:
    """A prefill probe's time: the engine's own where it reported one, else the wall time of its answer."""
    return p["engine_s"] if p.get("engine_s") is not None else p["seconds"]


def step_seconds(d: dict[str, Any]) -> float:
    """A decode probe's step: the engine's own where it reported one, else from the answers' wall times."""
    return d["engine_step_s"] if d.get("engine_step_s") is not None else d["step_s"]


def prefill_chunks(new_tokens: float, budget: int = EngineConfig.max_num_batched_tokens) -> int:
    """Steps that prefill ``new_tokens`` at ``budget`` tokens a step (vLLM's chunked prefill, at the
    simulator's default budget: the forecast's engine prefills at it too)."""
    return max(1, math.ceil(new_tokens / budget))


def clock_of(probes: list[dict[str, Any]], key: str) -> str:
    """``"engine"`` when every probe carries the engine's own time (``key``), else ``"wall"``: one clock
    for all the probes of a fit, as the intercept differs between the two."""
    return "engine" if probes and all(p.get(key) is not None for p in probes) else "wall"


async def probe(engine: str, model: str | None, quick: bool) -> dict[str, Any]:
    from core.engine_metrics import pool_tokens

    p = Prober(engine, model, random.Random())  # fresh words on every run: a re-fit finds nothing cached
    async with httpx.AsyncClient() as client:
        await p.setup(client)
        metrics = (await client.get(f"{p.engine}/metrics", timeout=30)).text
        await p.prefill(client, 64)  # warm-up
        sizes = [128, 512, 1024, 2048, 4096] + ([] if quick else [8192])
        prefills = []
        # the fastest of three: what a shared machine adds is never negative (on either clock)
        for n in sizes:
            prefills.append(min([await p.prefill(client, n) for _ in range(3)], key=prefill_seconds))
        for base in EXTEND_BASES[: None if not quick else 2]:
            # kept only where the engine says what it had cached (vLLM without
            # --enable-prompt-tokens-details does not): the offset is the point of the probe
            runs = [r for _ in range(3) if (r := await p.extend(client, base, EXTEND_WORDS))["cached_tokens"]]
            if runs:
                prefills.append(min(runs, key=prefill_seconds))
        first = await p.decode(client, 1, 1024, DECODE_SHORT, DECODE_SHORT + MIN_DECODE_STEPS)
        steps = decode_steps(step_seconds(first))
        decodes = [first] if steps == MIN_DECODE_STEPS else []
        for batch, ctx in decode_probes(pool_tokens(metrics), steps)[1 if decodes else 0 :]:
            decodes.append(await p.decode(client, batch, ctx, DECODE_SHORT, DECODE_SHORT + steps))
    return {"metrics": metrics, "prefills": prefills, "decodes": decodes, "model": p.model}


def fit_from_probes(
    metrics: str, prefills: list[dict[str, Any]], decodes: list[dict[str, Any]]
) -> dict[str, Any]:
    from core.engine_metrics import pool_tokens

    pool = pool_tokens(metrics)
    m = re.search(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"', metrics)
    block = int(m.group(1)) if m else 16
    clocks = {"prefill": clock_of(prefills, "engine_s"), "decode": clock_of(decodes, "engine_step_s")}
    p_key = "engine_s" if clocks["prefill"] == "engine" else "seconds"
    d_key = "engine_step_s" if clocks["decode"] == "engine" else "step_s"
    # decode: step = T0 + gamma * batch * ctx
    d_rows = [[1.0, d["batch"] * d["ctx"]] for d in decodes]
    t0, gamma = least_squares(d_rows, [d[d_key] for d in decodes])

    # prefill of n new tokens after s cached: t = c + alpha*n + beta*n*(s + n/2), c free (module doc)
    def new_cached(p: dict[str, Any]) -> tuple[float, float]:
        cached = min(p.get("cached_tokens") or 0, p["prompt_tokens"])
        return p["prompt_tokens"] - cached, cached

    p_rows = [[1.0, n, n * (s + n / 2.0)] for n, s in map(new_cached, prefills)]
    # a prompt longer than a step's token budget is prefilled in chunks, one step (and its T0) each
    p_ys = [p[p_key] - t0 * (prefill_chunks(new_cached(p)[0]) - 1) for p in prefills]
    c, alpha, beta = least_squares(p_rows, p_ys)

    def pre(n: float, s: float = 0.0) -> float:
        return c + alpha * n + beta * n * (s + n / 2)

    residuals = [
        {
            "prompt_tokens": p["prompt_tokens"],
            "cached_tokens": new_cached(p)[1],
            "measured_s": round(p[p_key], 4),
            "fitted_s": round(pre(*new_cached(p)), 4),
        }
        for p in prefills
    ]
    d_res = [
        {
            "batch": d["batch"],
            "ctx": d["ctx"],
            "measured_s": round(d[d_key], 5),
            "fitted_s": round(t0 + gamma * d["batch"] * d["ctx"], 5),
        }
        for d in decodes
    ]
    settings: dict[str, Any] = {
        "step_overhead_s": round(t0, 6),
        "prefill_per_token_s": alpha,
        "prefill_attention_s": beta,
        "decode_per_ctx_token_s": gamma,
        "block_size": block,
    }
    if pool:
        settings["pool_tokens"] = pool
    return {
        "set": {k: (f"{v:.6g}" if isinstance(v, float) else str(v)) for k, v in settings.items()},
        "clock": clocks,
        "prefill_intercept_s": round(c, 6),
        "prefill_residuals": residuals,
        "decode_residuals": d_res,
        "miss_to_hit_cost_ratio_at_4k": round(pre(4096) / (t0 + alpha * 300 + beta * 300 * (3796 + 150)), 2),
    }


def fit_command(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        probes = asyncio.run(probe(args.engine, args.model, args.quick))
    except httpx.HTTPError as exc:
        print(f"error: probing {args.engine} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    result = fit_from_probes(probes["metrics"], probes["prefills"], probes["decodes"])
    if "pool_tokens" not in result["set"]:
        print(
            f"error: {args.engine}/metrics has no pool size (vllm:cache_config_info or "
            "sglang:max_total_num_tokens)",
            file=sys.stderr,
        )
        return 1
    result.update(
        {
            "engine": args.engine,
            "model": probes["model"],
            "probe_s": round(time.perf_counter() - t0, 1),
            "prefills": probes["prefills"],
            "decodes": probes["decodes"],
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("set", "clock", "miss_to_hit_cost_ratio_at_4k", "probe_s")}))
    return 0


def add_fit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine base URL (probed directly, not through a sidecar)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--model", default=None)
    p.add_argument("--quick", action="store_true", help="skip the largest prefill probe")


def fit_overrides(path: Path) -> dict[str, str]:
    """The ``--set`` values a ``fit.json`` carries (for ``simulator run --fit``)."""
    try:
        data = json.loads(path.read_text())
        values = data["set"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SimConfigError(f"--fit {path}: not a fit.json written by `simulator fit` ({exc})") from None
    if not isinstance(values, dict):
        raise SimConfigError(
            f"--fit {path}: 'set' must be an object of simulator settings, got {type(values).__name__}"
        )
    return {str(k): str(v) for k, v in values.items()}


def add_run_with_fit_arguments(p: argparse.ArgumentParser) -> None:
    """``simulator run``'s arguments plus ``--fit`` and ``--preset``."""
    from simulator.experiments import add_run_arguments

    add_run_arguments(p)
    p.add_argument("--fit", type=Path, default=None, help="fit.json of `simulator fit`: cost model and pool")
    p.add_argument("--preset", default=None, help=f"named workload settings: {', '.join(sorted(PRESETS))}")


def run_with_fit_command(args: argparse.Namespace) -> int:
    """``simulator run`` with the preset's and the fit's settings placed before the command's own ``--set``."""
    from simulator.experiments import run_command

    try:
        extra = {
            **preset_overrides(args.preset, args.scenario),
            **(fit_overrides(args.fit) if args.fit else {}),
        }
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.set = [f"{k}={v}" for k, v in extra.items()] + list(args.set)
    return run_command(args)
