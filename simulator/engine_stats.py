"""The engine's statistics, as vLLM exports them: counters and histograms with vLLM's bucket bounds.

Filled by ``simulator.engine.Engine``; exported by ``simulator.metrics``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# vLLM 0.33's bucket boundaries for the histograms we export
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (0, 1, 2, 5, 10, 20)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.n += times

    def cumulative(self) -> list[tuple[str, int]]:
        out = []
        acc = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((repr(float(bound)), acc))
        out.append(("+Inf", self.n))
        return out


@dataclass
class EngineStats:
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    prompt_tokens: int = 0
    prompt_computed: int = 0
    prompt_cached: int = 0
    prompt_offloaded: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    aborted: int = 0
    steps: int = 0
    busy_s: float = 0.0
    flushes: int = 0
    finished_by_reason: dict[str, int] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    prefill_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    decode_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    prompt_hist: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    generation_hist: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    prefill_kv_computed: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_BUCKETS))
    request_preemptions: Histogram = field(default_factory=lambda: Histogram(PREEMPTION_BUCKETS))
