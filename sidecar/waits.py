"""Distributions of waits at the sidecar: a cumulative histogram (for /metrics) and a recent window
(for the percentiles in /state). Pure: the caller passes ``now``."""

from __future__ import annotations

import bisect
import math
from collections import deque

BUCKETS_S: tuple[float, ...] = (
    0.1,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
RECENT_WINDOW_S = 300.0
RECENT_MAX = 10_000


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list (q in [0, 1])."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class WaitStats:
    """Observed waits in seconds: cumulative bucket counts, sum and count, and the recent samples."""

    def __init__(
        self,
        buckets: tuple[float, ...] = BUCKETS_S,
        window_s: float = RECENT_WINDOW_S,
        max_recent: int = RECENT_MAX,
    ) -> None:
        self.buckets = buckets
        self.window_s = window_s
        self.counts = [0] * (len(buckets) + 1)  # per bucket, the last one is +Inf
        self.sum = 0.0
        self.count = 0
        self._recent: deque[tuple[float, float]] = deque(maxlen=max_recent)

    def observe(self, now: float, seconds: float) -> None:
        if not math.isfinite(seconds):
            return
        seconds = max(0.0, seconds)
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds
        self.count += 1
        self._recent.append((now, seconds))

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs for a Prometheus histogram, +inf last."""
        out = []
        total = 0
        for bound, n in zip((*self.buckets, math.inf), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def recent(self, now: float) -> dict[str, float | int | None]:
        """p50, p95 and max over the samples of the last ``window_s`` seconds (null without samples)."""
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()
        values = sorted(v for _, v in self._recent)
        if not values:
            return {"p50": None, "p95": None, "max": None, "n": 0, "window_s": self.window_s}
        return {
            "p50": percentile(values, 0.5),
            "p95": percentile(values, 0.95),
            "max": values[-1],
            "n": len(values),
            "window_s": self.window_s,
        }
