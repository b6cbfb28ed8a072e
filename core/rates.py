"""Counters to per-interval rates, surviving counter resets and gaps.

Prometheus counters only go up while the process that exports them lives. An
engine restart resets them to zero (and changes `process_start_time_seconds`).
The rule here is deliberately conservative: an interval in which a counter
reset is reported as *no data* (``None``), never as a negative rate and never
as a spike made of everything counted since the restart. A pause between two
samples longer than ``max_gap_s`` is also *no data*: a gap stays a gap instead
of being drawn as a flat average across it.
"""

from __future__ import annotations

import math


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def counter_delta(
    prev: float | None, cur: float | None, *, prev_start: float | None = None, cur_start: float | None = None
) -> float | None:
    """Increase of a counter between two samples, or None when it cannot be known.

    None when either sample is missing or not finite, when the counter went
    backwards, or when the exporting process restarted in between (its start
    time changed), even if the new value happens to be larger.
    """
    if not (_finite(prev) and _finite(cur)):
        return None
    assert prev is not None and cur is not None
    if _finite(prev_start) and _finite(cur_start) and prev_start != cur_start:
        return None
    if cur < prev:
        return None
    return cur - prev


def counter_rate(
    prev: float | None,
    prev_ts: float | None,
    cur: float | None,
    cur_ts: float,
    *,
    max_gap_s: float | None = None,
    prev_start: float | None = None,
    cur_start: float | None = None,
) -> float | None:
    """Per-second rate of a counter over one interval, or None (reset, gap, bad data)."""
    if prev_ts is None or not math.isfinite(prev_ts) or not math.isfinite(cur_ts):
        return None
    elapsed = cur_ts - prev_ts
    if elapsed <= 0 or (max_gap_s is not None and elapsed > max_gap_s):
        return None
    delta = counter_delta(prev, cur, prev_start=prev_start, cur_start=cur_start)
    if delta is None:
        return None
    return delta / elapsed


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator clamped to [0, 1]; None when the denominator is not positive.

    Used for hit rates from counter deltas, where an interval with no prompt
    tokens has no hit rate at all (not a rate of zero).
    """
    if not (_finite(numerator) and _finite(denominator)):
        return None
    assert numerator is not None and denominator is not None
    if denominator <= 0:
        return None
    return min(1.0, max(0.0, numerator / denominator))
