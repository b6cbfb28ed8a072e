"""Engine snapshots: one engine label's cumulative counters and gauges at one scrape, and the
parsed page holding one per engine label. Pure.

`sum_snapshots` sums them across engine labels: counters, running and waiting requests and the
pool add up; KV usage is weighted by pool where every pool is known, else averaged; histogram
buckets are merged (`core.engine_metrics.histograms.merge`); a histogram's ``_sum`` adds up when
every label with that histogram has one (else it is left out: a partial sum would give a wrong mean).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import core.engine_metrics.histograms as hist
from core import rates

EngineKind = Literal["vllm", "sglang", "unknown"]
# The cumulative counters of an `EngineSnapshot`: summed across labels, per-second rates over an interval.
COUNTERS = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prompt_tokens",
    "generation_tokens",
    "cached_tokens",
    "preemptions",
)


@dataclass(frozen=True)
class EngineSnapshot:
    """Cumulative counters and current gauges of one engine label at one scrape."""

    engine_label: str = ""
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    cached_tokens: float | None = None
    preemptions: float | None = None
    kv_usage: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    pool_tokens: int | None = None
    block_size: int | None = None
    """KV block size in tokens (vLLM ``cache_config_info`` ``block_size``; None when not reported)."""
    # TTFT histogram: cumulative (upper bound, count) pairs, ascending, +Inf last.
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    # The other serving histograms, (family, buckets) for each family present (see `histograms`).
    histograms: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    # The cumulative ``_sum`` of the families whose interval mean is a signal (`histograms.MEAN_FAMILIES`).
    histogram_sums: hist.Sums = ()

    def hit_ratio_lifetime(self) -> float | None:
        """hits / queries since the engine started (not an interval rate)."""
        return rates.ratio(self.prefix_cache_hits, self.prefix_cache_queries)


@dataclass(frozen=True)
class ParsedPage:
    kind: EngineKind
    engines: Mapping[str, EngineSnapshot]
    process_start_ts: float | None = None
    model_names: tuple[str, ...] = ()
    prefix_cache_unit: Literal["tokens", "blocks"] = "tokens"
    warnings: tuple[str, ...] = ()

    def total(self) -> EngineSnapshot:
        """All engine labels summed (counters, running, waiting, pool); KV usage pool-weighted."""
        return sum_snapshots(self.engines.values())


def _add(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def sum_snapshots(snapshots: Iterable[EngineSnapshot]) -> EngineSnapshot:
    """Sum of snapshots across engine labels (label ``""``); KV usage weighted by pool when known."""
    items = list(snapshots)
    if not items:
        return EngineSnapshot()
    if len(items) == 1:
        return replace(items[0], engine_label="")
    summed: dict[str, float | None] = {}
    for name in (*COUNTERS, "requests_running", "requests_waiting"):
        value: float | None = None
        for item in items:
            value = _add(value, getattr(item, name))
        summed[name] = value
    pools = [i.pool_tokens for i in items]
    pool_total = sum(p for p in pools if p is not None) if any(p is not None for p in pools) else None
    usages = [(i.kv_usage, i.pool_tokens) for i in items if i.kv_usage is not None]
    kv: float | None = None
    if usages:
        if all(p for _, p in usages):
            kv = sum(u * float(p or 0) for u, p in usages) / sum(float(p or 0) for _, p in usages)
        else:
            kv = sum(u for u, _ in usages) / len(usages)
    families = sorted({f for item in items for f, _ in item.histograms})
    others = tuple((f, hist.merge(dict(item.histograms).get(f, ()) for item in items)) for f in families)
    sums = []
    for family in sorted({f for item in items for f, _ in item.histogram_sums}):
        having = [item for item in items if dict(item.histograms).get(family)]
        parts = [dict(item.histogram_sums).get(family) for item in having]
        if parts and all(p is not None for p in parts):
            sums.append((family, sum(p for p in parts if p is not None)))
    return EngineSnapshot(
        engine_label="",
        prefix_cache_queries=summed["prefix_cache_queries"],
        prefix_cache_hits=summed["prefix_cache_hits"],
        prompt_tokens=summed["prompt_tokens"],
        generation_tokens=summed["generation_tokens"],
        cached_tokens=summed["cached_tokens"],
        preemptions=summed["preemptions"],
        kv_usage=kv,
        requests_running=summed["requests_running"],
        requests_waiting=summed["requests_waiting"],
        pool_tokens=pool_total,
        block_size=max((i.block_size for i in items if i.block_size is not None), default=None),
        ttft_buckets=hist.merge(item.ttft_buckets for item in items),
        histograms=others,
        histogram_sums=tuple(sums),
    )
