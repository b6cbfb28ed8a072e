"""Collapse risk: how close an engine is to the metastable collapse, minutes before R_t falls. Pure.

The ``collapse`` alert (`core.alerts`) fires once the hit ratio has *already* fallen. This model
reads the causes instead: collapse is a KV-pool overflow (the prefixes that come back next are
evicted, every turn becomes a full prefill, the prefill work outruns the engine and the backlog
grows; see docs/collapse-risk.md). Each of its inputs measures one link of that chain.

Inputs (``points``: ``(ts, {signal: value})`` oldest first, the signals of `core.signals` as the
collectors store them; ``now``: the clock, passed in). Two input sets, chosen by ``mode``:

``sidecar`` (a PrefixOps sidecar fronts the engine; its ``/state`` signals)
    - ``demand_projection``: ``projected_demand_fraction``, the demand the admitted sessions are
      expected to hold ``projection_horizon_s`` from now against the pool (`core.projection`: their
      growth per turn, turns left and pace, plus arrivals; sessions due to end leave), mean over
      ``level_s``. Without that signal: the ``level_s`` mean of ``demand_fraction``, plus its growth
      per minute (least squares over ``trend_s``) times the horizon only while that mean is at least
      ``demand_trend_floor`` (a system filling from far below the pool, as at a sidecar's start, is
      not extrapolated past it). Ramps ``projection_lo`` .. ``projection_hi``.
    - ``kv_demand``: the *lasting* KV demand of the admitted sessions against the pool: the smaller
      of ``demand_fraction``'s ``level_s`` mean and ``demand_projection``'s value (an overflow the
      projection sees ending within the horizon, sessions at their last turns, evicts little).
      Pressure ramps from ``demand_lo`` to ``demand_hi``. The gates below ("near the pool") test
      this value against ``demand_trend_floor``.
    - ``demand_trend``: growth of ``demand_fraction`` per minute (least squares over ``trend_s``),
      counted only near the pool (else 0), and not while a reported projection (the
      ``projected_demand_fraction`` signal, not the fallback) is above ``demand_fraction``'s ``level_s``
      mean (else 0): that projection already contains the growth (per turn and from arrivals), and
      counting the trend as well would count the same evidence twice. With the projection at or below
      today's demand (it sees sessions leaving), a still-growing demand is evidence it does not hold,
      and counts. Ramps ``demand_growth_lo`` .. ``demand_growth_hi``.
    - ``session_flow``: session arrivals minus completions per minute, the growth of
      ``sessions_in_system`` (least squares over ``trend_s``), counted only near the pool. Ramps
      ``flow_lo`` .. ``flow_hi``.
    - ``missed_prefill``: missed prompt tokens per second against the engine's prefill capacity
      ``prefill_capacity_tokens_per_s``: engine ``prompt_tokens_per_s - cached_tokens_per_s`` when
      those are in ``points``, else estimated from the sidecar as
      ``turns_per_s * (demand_tokens / admitted) * (1 - token_weighted)``; mean over ``level_s``.
      A symptom: counted only near the pool (below it every admitted prefix fits, so misses are cold
      or one-off, e.g. a prefix-cache flush, and heal on the next turn). Ramps ``missed_lo`` ..
      ``missed_hi`` (fractions of the capacity).
    - ``rt_trend``: fall of R_t (``token_weighted``, mean over ``level_s``) below its highest
      ``level_s`` mean in the last ``reference_s``; a symptom, counted only near the pool. Ramps
      ``drop_lo`` .. ``drop_hi``.

``engine`` (no sidecar: the engine's own ``/metrics``). The symptoms ``hit_trend``,
``missed_prefill`` and ``throughput`` count only while the pool is under pressure (else 0):
``kv_usage``'s ``level_s`` mean at least ``kv_lo``, or ``queue``'s at least ``queue_lo`` (requests
waiting for blocks) unless a request was preempted with room in the pool within ``trend_s`` (a point
in ``(now - trend_s, now]`` with ``preemptions_per_s`` > 0 and that point's ``kv_usage`` under
``kv_lo``): a preemption with free blocks is not for lack of blocks (a prefix-cache flush preempts
every running request), and the queue it leaves is re-queued work, not a wait for blocks. With room
in the pool, misses are cold or one-off (a flush), not evictions.
    - ``kv_usage``: mean over ``level_s``; ramps ``kv_lo`` .. ``kv_hi``.
    - ``queue``: ``requests_waiting``, mean over ``level_s``; ramps ``queue_lo`` .. ``queue_hi``.
    - ``queue_growth``: ``requests_waiting`` growth per minute over ``trend_s``; ramps
      ``queue_growth_lo`` .. ``queue_growth_hi``.
    - ``preemptions``: ``preemptions_per_s``, mean over ``level_s``; ramps ``preempt_lo`` .. ``preempt_hi``.
    - ``hit_trend``: fall of the engine hit ratio (``prefix_cache_hits_per_s`` summed over
      ``level_s`` / ``prefix_cache_queries_per_s`` summed; ``engine_hit_ratio`` mean when the
      counters are absent) below its highest ``level_s`` value in the last ``reference_s``.
      Ramps ``drop_lo`` .. ``drop_hi``.
    - ``missed_prefill``: ``prompt_tokens_per_s - cached_tokens_per_s`` (mean over ``level_s``)
      against ``prefill_capacity_tokens_per_s``, as for the sidecar.
    - ``throughput``: fall of ``generation_tokens_per_s`` (mean over ``level_s``) below its
      highest ``level_s`` mean in the last ``reference_s``, counted only while
      ``prompt_tokens_per_s`` is not falling with it (less work offered is not a symptom).
      Ramps ``drop_lo`` .. ``drop_hi``.

Scoring: each input gets a *pressure* in [0, 1], ``ramp(value, lo, hi)`` (0 at or below ``lo``,
1 at or above ``hi``, linear between), and contributes ``weight * pressure`` (weights in
``RiskSettings``, per mode). The *score* is ``min(1, sum of contributions)``: no single input
can raise a warning alone, since every weight is below ``warn_enter`` (`RiskSettings` rejects a
weight at or above it); agreement between causes does.
A symptom whose cause does not hold is reported with value 0. An input whose signals are absent
contributes nothing and is reported with value None; when no input of the mode has data the score is
None (unknown).

The *leading inputs* are the inputs with a positive contribution, largest first: what an operator
reads to see why the risk is high. `Assessment.summary` names them with their values.

Warning (the ``collapse-risk`` alert in `core.alerts`): the condition holds while the score is at
least ``warn_enter``; the exit condition (hysteresis) is a score below ``warn_exit``; the alert
fires after ``warn_for_s`` of the condition and resolves after ``warn_clear_s`` of the exit
condition. Defaults were tuned on simulated runs (docs/collapse-risk.md names the seed bases).

Stored signals (for the pages): ``collapse_risk`` (the score) and ``risk_<input>`` (each input's
contribution), see `core.signals`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Literal

from core import signals as sig
from core.risk_symptoms import (
    ENGINE_SYMPTOM_SIGNALS,
    drop,
    engine_symptoms,
    gated,
    missed_tokens_per_s,
    preempted_with_room,
    present,
)
from core.risk_windows import Points, mean, slope_per_min, window

Mode = Literal["sidecar", "engine"]
MODES: tuple[Mode, ...] = ("sidecar", "engine")

SIDECAR_INPUTS = (
    "demand_projection",
    "kv_demand",
    "demand_trend",
    "session_flow",
    "missed_prefill",
    "rt_trend",
)
ENGINE_INPUTS = (
    "kv_usage",
    "queue",
    "queue_growth",
    "preemptions",
    "hit_trend",
    "missed_prefill",
    "throughput",
)
INPUTS: dict[Mode, tuple[str, ...]] = {"sidecar": SIDECAR_INPUTS, "engine": ENGINE_INPUTS}
ALL_INPUTS = tuple(dict.fromkeys(SIDECAR_INPUTS + ENGINE_INPUTS))

# What each input means, for summaries, the pages and the runbook.
WHY: dict[str, str] = {
    "demand_projection": "demand the admitted sessions will hold in a minute (growth, turns left, arrivals) vs the pool",
    "kv_demand": "lasting KV demand of admitted sessions (today's or projected, the smaller) vs the pool: above 1 their prefixes evict each other",
    "demand_trend": "demand still growing near the pool: the overflow is coming, not passing",
    "session_flow": "sessions arriving faster than they complete: the backlog (and demand) keeps growing",
    "missed_prefill": "missed prompt tokens/s vs the engine's prefill capacity: misses are eating the engine",
    "rt_trend": "token-weighted hit rate (R_t) falling from its recent level",
    "kv_usage": "KV blocks held by running requests: no room left to keep idle sessions' prefixes",
    "queue": "requests waiting for KV blocks or a batch slot",
    "queue_growth": "the waiting queue is growing: arrivals outpace the engine",
    "preemptions": "running requests preempted for lack of KV blocks",
    "hit_trend": "engine prefix-cache hit ratio falling from its recent level",
    "throughput": "generated tokens/s falling while the prompt load does not",
}
UNITS: dict[str, str] = {
    "demand_projection": "of pool",
    "kv_demand": "of pool",
    "demand_trend": "of pool/min",
    "session_flow": "sessions/min",
    "missed_prefill": "of prefill capacity",
    "rt_trend": "below recent",
    "kv_usage": "",
    "queue": "requests",
    "queue_growth": "requests/min",
    "preemptions": "/s",
    "hit_trend": "below recent",
    "throughput": "below recent",
}
SIGNAL_OF_INPUT: dict[str, str] = {name: sig.RISK_PREFIX + name for name in ALL_INPUTS}
assert set(SIGNAL_OF_INPUT.values()) == set(sig.RISK_INPUT_SIGNALS), "core.signals lists every risk input"

# Signals the model reads (histories that feed it must keep these).
INPUT_SIGNALS = frozenset(
    {
        sig.DEMAND_FRACTION,
        sig.PROJECTED_DEMAND_FRACTION,
        sig.DEMAND_TOKENS,
        sig.ADMITTED,
        sig.SESSIONS_IN_SYSTEM,
        sig.TURNS_PER_S,
        sig.TOKEN_WEIGHTED,
        sig.PROMPT_TOKENS_PER_S,
        sig.CACHED_TOKENS_PER_S,
        sig.KV_USAGE,
        sig.REQUESTS_WAITING,
        sig.PREEMPTIONS_PER_S,
        sig.PREFIX_CACHE_HITS_PER_S,
        sig.PREFIX_CACHE_QUERIES_PER_S,
        sig.ENGINE_HIT_RATIO,
        sig.GENERATION_TOKENS_PER_S,
    }
)


@dataclass(frozen=True)
class RiskSettings:
    """The model's parameters and the warning's thresholds; rejects bad values at construction."""

    level_s: float = 30.0
    trend_s: float = 60.0
    reference_s: float = 300.0
    prefill_capacity_tokens_per_s: float = 10_000.0
    projection_horizon_s: float = 60.0
    # sidecar inputs
    projection_lo: float = 1.1
    projection_hi: float = 1.2
    demand_lo: float = 1.0
    demand_hi: float = 1.25
    demand_trend_floor: float = 0.9
    demand_growth_lo: float = 0.02
    demand_growth_hi: float = 0.15
    flow_lo: float = 0.5
    flow_hi: float = 3.0
    # both
    missed_lo: float = 0.3
    missed_hi: float = 0.6
    drop_lo: float = 0.1
    drop_hi: float = 0.4
    # engine inputs
    kv_lo: float = 0.65
    kv_hi: float = 0.95
    queue_lo: float = 3.0
    queue_hi: float = 20.0
    queue_growth_lo: float = 2.0
    queue_growth_hi: float = 13.0
    preempt_lo: float = 0.05
    preempt_hi: float = 0.35
    # weights (a contribution is weight x pressure; the score is their sum, capped at 1)
    w_demand_projection: float = 0.55
    w_kv_demand: float = 0.5
    w_demand_trend: float = 0.2
    w_session_flow: float = 0.1
    w_missed_prefill: float = 0.4
    w_rt_trend: float = 0.2
    w_kv_usage: float = 0.55
    w_queue: float = 0.3
    w_queue_growth: float = 0.15
    w_preemptions: float = 0.15
    w_hit_trend: float = 0.1
    w_throughput: float = 0.1
    # the warning (the collapse-risk alert's thresholds and hold times)
    warn_enter: float = 0.6
    warn_exit: float = 0.35
    warn_for_s: float = 5.0
    warn_clear_s: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"risk setting {f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"risk setting {f.name} must not be negative, got {value}")
        for name in (
            "level_s",
            "trend_s",
            "reference_s",
            "prefill_capacity_tokens_per_s",
            "projection_horizon_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"risk setting {name} must be positive, got {getattr(self, name)}")
        for lo, hi in (
            ("projection_lo", "projection_hi"),
            ("demand_lo", "demand_hi"),
            ("demand_growth_lo", "demand_growth_hi"),
            ("flow_lo", "flow_hi"),
            ("missed_lo", "missed_hi"),
            ("drop_lo", "drop_hi"),
            ("kv_lo", "kv_hi"),
            ("queue_lo", "queue_hi"),
            ("queue_growth_lo", "queue_growth_hi"),
            ("preempt_lo", "preempt_hi"),
        ):
            if getattr(self, lo) >= getattr(self, hi):
                raise ValueError(
                    f"risk setting {lo} must be below {hi}, got {getattr(self, lo)} >= {getattr(self, hi)}"
                )
        if not 0 < self.warn_enter <= 1:
            raise ValueError(f"risk setting warn_enter must be in (0, 1], got {self.warn_enter}")
        if self.warn_exit >= self.warn_enter:
            raise ValueError(
                "risk setting warn_exit must be below warn_enter (hysteresis), "
                f"got {self.warn_exit} >= {self.warn_enter}"
            )
        heavy = [
            f.name
            for f in fields(self)
            if f.name.startswith("w_") and getattr(self, f.name) >= self.warn_enter
        ]
        if heavy:
            raise ValueError(
                f"risk setting(s) {heavy} must be below warn_enter ({self.warn_enter}): "
                "no single input may raise the warning alone"
            )

    def weight(self, name: str) -> float:
        return float(getattr(self, "w_" + name))

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> RiskSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown risk setting(s) {unknown}; known: {sorted(known)}")
        return cls(**data)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RiskInput:
    """One input at one instant: its measured value, pressure in [0, 1] and weighted contribution."""

    name: str
    value: float | None
    pressure: float
    contribution: float

    @property
    def why(self) -> str:
        return WHY[self.name]


@dataclass(frozen=True)
class Assessment:
    """The risk of one engine at ``ts``: score in [0, 1] (None: no data) and every input."""

    ts: float
    mode: Mode
    score: float | None
    inputs: tuple[RiskInput, ...] = field(default_factory=tuple)

    def leading(self, n: int | None = None) -> list[RiskInput]:
        """Inputs with a positive contribution, largest first (ties by name)."""
        out = sorted((i for i in self.inputs if i.contribution > 0), key=lambda i: (-i.contribution, i.name))
        return out if n is None else out[:n]

    def signals(self) -> dict[str, float]:
        """``collapse_risk`` and ``risk_<input>`` contributions, for storage (nothing when unknown)."""
        if self.score is None:
            return {}
        out = {sig.COLLAPSE_RISK: round(self.score, 4)}
        out.update(
            {SIGNAL_OF_INPUT[i.name]: round(i.contribution, 4) for i in self.inputs if i.value is not None}
        )
        return out

    def summary(self, n: int = 3) -> str:
        if self.score is None:
            return "collapse risk unknown (no data)"
        lead = self.leading(n)
        if not lead:
            return f"collapse risk {self.score:.2f}: no input under pressure"
        parts = [
            f"{i.name} {_fmt(i.value)} {UNITS[i.name]}".rstrip() + f" (+{i.contribution:.2f}: {i.why})"
            for i in lead
        ]
        return f"collapse risk {self.score:.2f} ({self.mode} inputs); leading: " + "; ".join(parts)


def _fmt(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def ramp(value: float | None, lo: float, hi: float) -> float:
    """0 at or below ``lo``, 1 at or above ``hi``, linear between (None gives 0)."""
    if value is None or value <= lo:
        return 0.0
    if value >= hi:
        return 1.0
    return (value - lo) / (hi - lo)


# ------------------------------------------------------------------ the model
def _values(points: Points, now: float, mode: Mode, s: RiskSettings) -> dict[str, float | None]:
    level = now - s.level_s
    trend = now - s.trend_s
    ref = now - s.reference_s
    out: dict[str, float | None] = {}
    if mode == "sidecar":
        now_demand = mean(window(points, sig.DEMAND_FRACTION, level, now))
        growth = slope_per_min(window(points, sig.DEMAND_FRACTION, trend, now))
        near_now = now_demand is not None and now_demand >= s.demand_trend_floor
        reported = mean(window(points, sig.PROJECTED_DEMAND_FRACTION, level, now))
        projected = reported
        if projected is None and now_demand is not None:
            # the fallback extrapolates only near the pool (a system filling from far below is not
            # overflowing: at a sidecar's start, demand rising from 0 would extrapolate past the pool)
            projected = now_demand + (growth * s.projection_horizon_s / 60.0 if near_now and growth else 0.0)
        out["demand_projection"] = projected
        # the overflow that evicts is the one that lasts: demand the projection sees leaving within the
        # horizon (sessions at their last turns) is not counted
        demand = now_demand if now_demand is None or projected is None else min(now_demand, projected)
        out["kv_demand"] = demand
        near = demand is not None and demand >= s.demand_trend_floor
        # a reported projection above today's demand already contains the growth: not counted twice
        foreseen = reported is not None and now_demand is not None and reported > now_demand
        out["demand_trend"] = (
            None if growth is None or demand is None else (growth if near and not foreseen else 0.0)
        )
        flow = slope_per_min(window(points, sig.SESSIONS_IN_SYSTEM, trend, now))
        out["session_flow"] = None if flow is None or demand is None else (flow if near else 0.0)
        # symptoms count only near the pool: below it every admitted prefix fits, so misses are cold
        # or one-off (a flush) and heal on the next turn
        missed = missed_tokens_per_s(points, now, s, sidecar=True)
        out["missed_prefill"] = gated(
            None if missed is None else missed / s.prefill_capacity_tokens_per_s, near
        )
        if near:
            out["rt_trend"] = drop(window(points, sig.TOKEN_WEIGHTED, ref, now), now, s)
        else:
            out["rt_trend"] = 0.0 if present(points, (sig.TOKEN_WEIGHTED,), level, now) else None
        return out
    kv = mean(window(points, sig.KV_USAGE, level, now))
    out["kv_usage"] = kv
    out["queue"] = mean(window(points, sig.REQUESTS_WAITING, level, now))
    out["queue_growth"] = slope_per_min(window(points, sig.REQUESTS_WAITING, trend, now))
    out["preemptions"] = mean(window(points, sig.PREEMPTIONS_PER_S, level, now))
    # symptoms count only while the pool is under pressure (kv_usage at kv_lo or above, or requests
    # waiting, queue_lo or more): misses with room in the pool are cold or one-off (a flush), not evictions
    queue = out["queue"]
    waiting = queue is not None and queue >= s.queue_lo and not preempted_with_room(points, now, s)
    if (kv is not None and kv >= s.kv_lo) or waiting:
        out.update(engine_symptoms(points, now, s))
    else:  # 0, or None without data (not computed: the collectors judge every scrape)
        for name, signals in ENGINE_SYMPTOM_SIGNALS.items():
            out[name] = 0.0 if present(points, signals, level, now) else None
    return out


def _pressure(name: str, value: float | None, s: RiskSettings) -> float:
    lo, hi = {
        "demand_projection": (s.projection_lo, s.projection_hi),
        "kv_demand": (s.demand_lo, s.demand_hi),
        "demand_trend": (s.demand_growth_lo, s.demand_growth_hi),
        "session_flow": (s.flow_lo, s.flow_hi),
        "missed_prefill": (s.missed_lo, s.missed_hi),
        "rt_trend": (s.drop_lo, s.drop_hi),
        "hit_trend": (s.drop_lo, s.drop_hi),
        "throughput": (s.drop_lo, s.drop_hi),
        "kv_usage": (s.kv_lo, s.kv_hi),
        "queue": (s.queue_lo, s.queue_hi),
        "queue_growth": (s.queue_growth_lo, s.queue_growth_hi),
        "preemptions": (s.preempt_lo, s.preempt_hi),
    }[name]
    return ramp(value, lo, hi)


def assess(points: Points, now: float, mode: Mode, settings: RiskSettings | None = None) -> Assessment:
    """The collapse risk at ``now`` from ``points`` (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"unknown risk mode {mode!r}; known: {', '.join(MODES)}")
    s = settings or RiskSettings()
    values = _values(points, now, mode, s)
    inputs = []
    for name in INPUTS[mode]:
        value = values.get(name)
        pressure = _pressure(name, value, s)
        inputs.append(
            RiskInput(
                name,
                None if value is None else round(value, 4),
                round(pressure, 4),
                round(s.weight(name) * pressure, 4),
            )
        )
    if all(i.value is None for i in inputs):
        return Assessment(now, mode, None, tuple(inputs))
    score = min(1.0, sum(i.contribution for i in inputs))
    return Assessment(now, mode, round(score, 4), tuple(inputs))


def mode_for(signals: Iterable[str]) -> Mode:
    """``sidecar`` when sidecar budgeter signals are present, else ``engine``."""
    return "sidecar" if sig.DEMAND_FRACTION in set(signals) else "engine"
