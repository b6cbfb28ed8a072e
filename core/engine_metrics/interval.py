"""Two snapshots of one engine label to its signals over the interval between them. Pure.

Gauges (KV usage, running and waiting requests, the pool) are taken from the newer snapshot;
counters become per-second rates, the prefix-cache hit ratio a ratio of the interval's deltas,
and histograms interval quantiles and, for ``histograms.MEAN_FAMILIES``, interval means
(`core.engine_metrics.histograms`). Rates are absent, not zero,
across a reset, a restart, a gap longer than ``max_gap_s`` or without a previous snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import core.engine_metrics.histograms as hist
from core import rates
from core import signals as sig
from core.engine_metrics.snapshot import COUNTERS, EngineSnapshot

# each counter of `EngineSnapshot` (snapshot.COUNTERS) and the signal of its per-second rate
RATE_SIGNAL = {
    "prefix_cache_queries": sig.PREFIX_CACHE_QUERIES_PER_S,
    "prefix_cache_hits": sig.PREFIX_CACHE_HITS_PER_S,
    "prompt_tokens": sig.PROMPT_TOKENS_PER_S,
    "generation_tokens": sig.GENERATION_TOKENS_PER_S,
    "cached_tokens": sig.CACHED_TOKENS_PER_S,
    "preemptions": sig.PREEMPTIONS_PER_S,
}


@dataclass(frozen=True)
class IntervalSignals:
    """Canonical signals for one engine label over one scrape interval."""

    values: dict[str, float] = field(default_factory=dict)
    reset: bool = False  # a counter went backwards or the process restarted: rates withheld


def interval_signals(
    prev: EngineSnapshot | None,
    prev_ts: float | None,
    cur: EngineSnapshot,
    cur_ts: float,
    *,
    restarted: bool = False,
    max_gap_s: float | None = None,
) -> IntervalSignals:
    """Gauges of `cur` plus rates over (prev_ts, cur_ts]; rates are absent (not zero) across a
    reset, a restart (`restarted`), a gap longer than `max_gap_s`, or without a previous scrape."""
    values: dict[str, float] = {}
    for name, value in (
        (sig.KV_USAGE, cur.kv_usage),
        (sig.REQUESTS_RUNNING, cur.requests_running),
        (sig.REQUESTS_WAITING, cur.requests_waiting),
    ):
        if value is not None:
            values[name] = float(value)
    if cur.pool_tokens is not None:
        values[sig.POOL_TOKENS] = float(cur.pool_tokens)
    if cur.block_size is not None:
        values[sig.BLOCK_SIZE] = float(cur.block_size)
    reset = restarted
    if prev is not None and prev_ts is not None and not restarted:
        elapsed = cur_ts - prev_ts
        deltas: dict[str, float | None] = {}
        for attr in COUNTERS:
            before, after = getattr(prev, attr), getattr(cur, attr)
            if before is None or after is None:
                deltas[attr] = None
                continue
            delta = rates.counter_delta(before, after)
            if delta is None:
                reset = True
            deltas[attr] = delta
        gap = elapsed <= 0 or (max_gap_s is not None and elapsed > max_gap_s)
        if not reset and not gap:
            for attr, name in RATE_SIGNAL.items():
                delta = deltas[attr]
                if delta is not None:
                    values[name] = delta / elapsed
            hit = rates.ratio(deltas["prefix_cache_hits"], deltas["prefix_cache_queries"])
            if hit is not None:
                values[sig.ENGINE_HIT_RATIO] = hit
            before = {"ttft": prev.ttft_buckets, **dict(prev.histograms)}
            after = {"ttft": cur.ttft_buckets, **dict(cur.histograms)}
            values.update(hist.interval_quantiles(before, after))
            values.update(
                hist.interval_means(before, dict(prev.histogram_sums), after, dict(cur.histogram_sums))
            )
    return IntervalSignals(values=values, reset=reset)
