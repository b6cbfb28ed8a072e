"""The collapse-risk model's symptom and miss inputs, over stored signal points (for `core.risk`). Pure.

Their definitions are in `core.risk`'s docstring (the specification): ``missed_prefill`` (engine
counters, or the sidecar's estimate), the falls below a recent best (``rt_trend``, ``hit_trend``,
``throughput``), the engine symptoms computed only while the pool is under pressure, and whether a
request was preempted with room in the pool (``preempted_with_room``). ``s`` is anything with
``level_s``, ``trend_s``, ``reference_s``, ``kv_lo`` and ``prefill_capacity_tokens_per_s``
(`core.risk.RiskSettings`).
"""

from __future__ import annotations

from typing import Protocol

from core import signals as sig
from core.risk_windows import Points, mean, rolling_best, window


class Spans(Protocol):
    @property
    def level_s(self) -> float: ...

    @property
    def trend_s(self) -> float: ...

    @property
    def kv_lo(self) -> float: ...

    @property
    def reference_s(self) -> float: ...

    @property
    def prefill_capacity_tokens_per_s(self) -> float: ...


def drop_best(pts: list[tuple[float, float]], now: float, s: Spans) -> tuple[float | None, float | None]:
    """(how far the last ``level_s`` mean sits below the best ``level_s`` mean of ``pts``, that best)."""
    recent = mean([p for p in pts if p[0] > now - s.level_s])
    best = rolling_best(pts, s.level_s)
    if recent is None or best is None:
        return None, best
    return max(0.0, best - recent), best


def drop(pts: list[tuple[float, float]], now: float, s: Spans) -> float | None:
    return drop_best(pts, now, s)[0]


# ------------------------------------------------------------------ the model
def missed_tokens_per_s(points: Points, now: float, s: Spans, *, sidecar: bool) -> float | None:
    start = now - s.level_s
    prompt = window(points, sig.PROMPT_TOKENS_PER_S, start, now)
    cached = dict(window(points, sig.CACHED_TOKENS_PER_S, start, now))
    engine = [p - cached[t] for t, p in prompt if t in cached]
    if engine:
        return sum(engine) / len(engine)
    if not sidecar:
        return None
    turns = mean(window(points, sig.TURNS_PER_S, start, now))
    rt = mean(window(points, sig.TOKEN_WEIGHTED, start, now))
    demand = mean(window(points, sig.DEMAND_TOKENS, start, now))
    admitted = mean(window(points, sig.ADMITTED, start, now))
    if turns is None or rt is None or demand is None or not admitted:
        return None
    return turns * (demand / admitted) * (1.0 - rt)


def engine_hit_drop(points: Points, now: float, s: Spans) -> float | None:
    ref_start = now - s.reference_s
    hits = window(points, sig.PREFIX_CACHE_HITS_PER_S, ref_start, now)
    queries = dict(window(points, sig.PREFIX_CACHE_QUERIES_PER_S, ref_start, now))
    pairs = [(t, h, queries[t]) for t, h in hits if t in queries]
    if not pairs:
        return drop(window(points, sig.ENGINE_HIT_RATIO, ref_start, now), now, s)
    # ratio of sums over each trailing level_s window, at every point
    ratios: list[tuple[float, float]] = []
    lo = 0
    h_acc = q_acc = 0.0
    for t, h, q in pairs:
        h_acc += h
        q_acc += q
        while pairs[lo][0] <= t - s.level_s:
            h_acc -= pairs[lo][1]
            q_acc -= pairs[lo][2]
            lo += 1
        if q_acc > 0:
            ratios.append((t, h_acc / q_acc))
    if not ratios:
        return None
    best = max(v for _, v in ratios)
    return max(0.0, best - ratios[-1][1]) if ratios[-1][0] > now - s.level_s else None


# The engine's symptoms and the signals whose presence makes each one known.
ENGINE_SYMPTOM_SIGNALS: dict[str, tuple[str, ...]] = {
    "hit_trend": (sig.PREFIX_CACHE_HITS_PER_S, sig.ENGINE_HIT_RATIO),
    "missed_prefill": (sig.CACHED_TOKENS_PER_S,),
    "throughput": (sig.GENERATION_TOKENS_PER_S,),
}


def present(points: Points, names: tuple[str, ...], start: float, now: float) -> bool:
    return any(window(points, name, start, now) for name in names)


def engine_symptoms(points: Points, now: float, s: Spans) -> dict[str, float | None]:
    ref = now - s.reference_s
    out: dict[str, float | None] = {"hit_trend": engine_hit_drop(points, now, s)}
    missed = missed_tokens_per_s(points, now, s, sidecar=False)
    out["missed_prefill"] = None if missed is None else missed / s.prefill_capacity_tokens_per_s
    gen = window(points, sig.GENERATION_TOKENS_PER_S, ref, now)
    fall, best = drop_best(gen, now, s)
    if fall is not None:
        fall = fall / best if best else 0.0
        prompt_fall, prompt_best = drop_best(window(points, sig.PROMPT_TOKENS_PER_S, ref, now), now, s)
        if prompt_fall is not None and prompt_best and prompt_fall / prompt_best >= fall:
            fall = 0.0  # less work offered, not a symptom
    out["throughput"] = fall
    return out


def preempted_with_room(points: Points, now: float, s: Spans) -> bool:
    """A point in ``(now - trend_s, now]`` with preemptions while its ``kv_usage`` was under ``kv_lo``.

    Such a preemption is not for lack of blocks (a prefix-cache flush preempts every running request),
    so the queue it leaves is re-queued work, not requests waiting for blocks."""
    start = now - s.trend_s
    usage = dict(window(points, sig.KV_USAGE, start, now))
    return any(
        rate > 0 and t in usage and usage[t] < s.kv_lo
        for t, rate in window(points, sig.PREEMPTIONS_PER_S, start, now)
    )


def gated(value: float | None, cause: bool) -> float | None:
    """A symptom's value while its cause holds, else 0 (None stays None: no data)."""
    return None if value is None else (value if cause else 0.0)
