"""The forecast's cost model (issue 16 item 3): what the collectors know of an engine's step times.

Pure functions, no I/O; ``simulator.forecast`` builds a forecast's inputs with them.

``cost_from_fit``: the cost model of a ``simulator fit`` file (``fit.json``'s
``set``). ``cost_with_fit``, what a forecast with a fit runs on, is the fit's
("a fitted one where it exists"): its probes vary the prompt's size, which
separates the attention term the recorded signals cannot (below), and its
decode probes time steps at known batches and contexts. A per-step term
(``STEP_TERMS``) the fit left at 0, which its probes could not resolve, is
taken from the recorded latencies when at least ``FIT_STEP_MIN_INTERVALS``
intervals give one (source ``fit+latencies``;
``ForecastInputs.cost_estimated`` names them). The recorded latencies'
``gamma`` is not preferred to a fit's: with ``beta`` folded into ``alpha``
the attention cost of a collapse's long prefills, which grows with the
context the running requests hold, is charged to ``gamma`` (1.4-2x the
simulated engine's own on the validation runs, docs/dashboard.md).
``cost_from_latencies``: one estimated from the engine's recorded
signals, all in wall-clock seconds, by least squares over the intervals of the
last ``COST_WINDOW_S`` (the cost model is the engine's, not the workload's, so
it looks further back than the workload window). It uses only signals that
exclude queueing: the *decode step time* ``y`` of each interval, exact where
the engine's histograms have their ``_sum`` (``decode_step``: ``itl_mean``;
else ``decode_time_mean / (output_len_mean - 1)``, vLLM's
``request_decode_time_seconds``, first token to last, over the tokens after
the first), else from interval medians (``itl_p50``; else
``decode_time_p50 / (output_len_p50 - 1)``; else
``(e2e_p50 - ttft_p50) / (output_len_p50 - 1)``: ratios of interpolations
inside buckets as wide as the values; on the validation runs the two gave
``gamma`` within 5% of each other), and the step identity of a
continuous-batching engine, whose every step decodes one token for each
running request and prefills a share of the new prompt tokens::

    y = T0 + gamma * K + alpha * (P * y)

``K``, the context the running requests hold: ``kv_usage * pool_tokens``
(else ``requests_running * prompt_len_p50``); ``P``, prompt tokens computed
per second, ``prefix_cache_queries_per_s - prefix_cache_hits_per_s`` (every
prefill, recomputation after preemption included; else
``prompt_tokens_per_s - cached_tokens_per_s``), so ``P * y`` is the prefill
tokens sharing a step; least squares of the relative residuals (each interval
divided by its ``y``: a healthy engine's steps are a hundredth of a collapsed
one's, and its intervals are what pins ``T0`` and ``gamma``). A collapsed engine's long TTFTs are waiting (for the
queue and behind other prefills), not per-token cost; its decode steps are
long because each carries a chunk of recomputed prefill, which this identity
charges to ``alpha``. ``beta`` (attention) and offload loads are folded into
``alpha`` (0 here: not separable from these signals; docs/dashboard.md measures what that costs).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from typing import Any

from simulator.config import CostModel, SimConfigError
from simulator.fit import least_squares

COST_WINDOW_S = 6 * 3600.0  # the engine's cost model: its signals over the last 6 hours
MIN_SAMPLES = 3  # latency intervals needed to estimate a cost model


class ForecastError(ValueError):
    """The collectors' data cannot make a forecast; the message names what is missing."""


def as_int(value: Any) -> int:
    """A row's count: a finite number, at least 0, else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return max(0, int(value))


def as_float(value: Any) -> float | None:
    """A setting's number (a string too), else None."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def as_num(value: Any) -> float | None:
    """A row's finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


_COST_KEYS = tuple(f.name for f in fields(CostModel))


def cost_from_fit(values: Mapping[str, Any]) -> CostModel:
    """The cost model of a fit file's ``set`` (keys of ``CostModel``; others, like the pool, are ignored)."""
    known = {}
    for k in _COST_KEYS:
        if k in values:
            try:
                known[k] = float(values[k])
            except (TypeError, ValueError):
                raise ForecastError(f"fit: {k}={values[k]!r} is not a number") from None
    if not known:
        raise ForecastError(f"fit: no cost-model setting in it (expected some of {', '.join(_COST_KEYS)})")
    try:
        return CostModel(**{k: known.get(k, 0.0) for k in _COST_KEYS})
    except SimConfigError as exc:
        raise ForecastError(f"fit: {exc}") from None


def decode_step(s: Mapping[str, Any]) -> float | None:
    """The interval's exact mean decode step (module doc), or None without the means."""
    itl = as_num(s.get("itl_mean"))
    if itl is not None:
        return itl
    decode, olen = as_num(s.get("decode_time_mean")), as_num(s.get("output_len_mean"))
    return decode / (olen - 1) if decode is not None and olen is not None and olen > 1 else None


def step_sample(s: Mapping[str, Any], pool_tokens: float | None = None) -> tuple[float, float, float] | None:
    """One interval's ``(y, K, P)`` of the step identity (module doc), or None when a signal is missing."""
    y = decode_step(s)
    if y is None:
        y = as_num(s.get("itl_p50"))
    olen = as_num(s.get("output_len_p50"))
    if y is None and olen is not None and olen > 1:
        decode = as_num(s.get("decode_time_p50"))
        if decode is None:
            e2e, first = as_num(s.get("e2e_p50")), as_num(s.get("ttft_p50"))
            decode = max(0.0, e2e - first) if e2e is not None and first is not None else None
        y = decode / (olen - 1) if decode is not None else None
    usage, running, plen = (
        as_num(s.get("kv_usage")),
        as_num(s.get("requests_running")),
        as_num(s.get("prompt_len_p50")),
    )
    if usage is not None and pool_tokens:
        k: float | None = usage * pool_tokens
    else:
        k = running * plen if running is not None and plen is not None else None
    queries, hits = as_num(s.get("prefix_cache_queries_per_s")), as_num(s.get("prefix_cache_hits_per_s"))
    if queries is not None and hits is not None:
        p: float | None = max(0.0, queries - hits)
    else:
        prompt, cached = as_num(s.get("prompt_tokens_per_s")), as_num(s.get("cached_tokens_per_s"))
        p = max(0.0, prompt - cached) if prompt is not None and cached is not None else None
    if y is None or y <= 0 or k is None or p is None:
        return None
    return y, k, p


def cost_from_latencies(samples: Iterable[Mapping[str, Any]], pool_tokens: float | None = None) -> CostModel:
    """A cost model estimated from per-interval engine signals (the step identity of the module doc)."""
    rows = [r for s in samples if (r := step_sample(s, pool_tokens)) is not None]
    if len(rows) < MIN_SAMPLES:
        raise ForecastError(
            f"no cost model: no fit file, and too few recorded intervals to estimate one ({len(rows)} with a "
            "decode step time (itl_p50, or decode_time_p50 or e2e_p50 and ttft_p50 with output_len_p50), the "
            "running context (kv_usage and the pool, or requests_running and prompt_len_p50) and the prompt "
            "tokens computed (prefix_cache_queries_per_s and prefix_cache_hits_per_s, or prompt_tokens_per_s "
            f"and cached_tokens_per_s); need {MIN_SAMPLES})"
        )
    # relative residuals (each row divided by its y): step times span two orders of magnitude between a
    # healthy engine and a collapsed one, and the few healthy intervals are what pins T0 and gamma
    xs = [[1.0 / y, k / y, p] for y, k, p in rows]
    ys = [1.0] * len(rows)
    varied = [len({round(r[i], 6) for r in rows}) > 1 for i in (1, 2)]
    if varied[0] and varied[1]:
        t0, gamma, alpha = least_squares(xs, ys)
    elif varied[0]:  # no prefill variation: no slope to charge to it
        t0, gamma = least_squares([x[:2] for x in xs], ys)
        alpha = 0.0
    else:  # one load level: no slope to separate; all of the step on the context it holds
        t0, alpha = 0.0, 0.0
        gamma = statistics.median(y for y, _, _ in rows) / rows[0][1] if rows[0][1] else 0.0
    return CostModel(
        step_overhead_s=t0,
        prefill_per_token_s=alpha,
        prefill_attention_s=0.0,
        decode_per_ctx_token_s=gamma,
        offload_load_per_token_s=0.0,
    )


STEP_TERMS = ("step_overhead_s", "decode_per_ctx_token_s")  # a fit left at 0 takes them from the latencies
FIT_STEP_MIN_INTERVALS = 60  # recorded intervals the latencies need before they stand in for a fit's term


def cost_with_fit(
    fit: Mapping[str, Any], samples: Iterable[Mapping[str, Any]], pool_tokens: float | None = None
) -> tuple[CostModel, str, tuple[str, ...]]:
    """The fit's cost model, a per-step term it left at 0 taken from the recorded latencies where they give
    one (module doc): ``(cost, source, the terms taken from the latencies)``."""
    cost = cost_from_fit(fit)
    missing = tuple(k for k in STEP_TERMS if getattr(cost, k) <= 0)
    rows = list(samples)
    if not missing or sum(step_sample(s, pool_tokens) is not None for s in rows) < FIT_STEP_MIN_INTERVALS:
        return cost, "fit", ()
    try:
        est = cost_from_latencies(rows, pool_tokens)
    except ForecastError:
        return cost, "fit", ()
    terms = tuple(k for k in missing if getattr(est, k) > 0)
    if not terms:
        return cost, "fit", ()
    return replace(cost, **{k: getattr(est, k) for k in terms}), "fit+latencies", terms
