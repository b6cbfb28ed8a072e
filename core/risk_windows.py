"""Windows over stored signal points, for `core.risk`. Pure.

``points`` are ``(ts, {signal: value})`` oldest first, as the collectors store them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Points = Sequence[tuple[float, Mapping[str, float]]]


def window(points: Points, name: str, start: float, end: float) -> list[tuple[float, float]]:
    """(ts, value) of ``name`` with start < ts <= end, oldest first (scans from the newest point)."""
    out: list[tuple[float, float]] = []
    for ts, values in reversed(points):
        if ts <= start:
            break
        if ts <= end and name in values:
            out.append((ts, values[name]))
    out.reverse()
    return out


def mean(pts: list[tuple[float, float]]) -> float | None:
    return sum(v for _, v in pts) / len(pts) if pts else None


def slope_per_min(pts: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (ts, value) per minute; None under 3 points or no time spread."""
    n = len(pts)
    if n < 3:
        return None
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    stt = sum((t - mt) ** 2 for t, _ in pts)
    if stt <= 0:
        return None
    return 60.0 * sum((t - mt) * (v - mv) for t, v in pts) / stt


def rolling_best(pts: list[tuple[float, float]], span_s: float) -> float | None:
    """Highest mean of ``pts`` over any trailing ``span_s`` (ends at each point), None when empty."""
    best: float | None = None
    lo = 0
    acc = 0.0
    for hi, (t, v) in enumerate(pts):
        acc += v
        while pts[lo][0] <= t - span_s:
            acc -= pts[lo][1]
            lo += 1
        m = acc / (hi - lo + 1)
        if best is None or m > best:
            best = m
    return best
