"""What ``simulator live-run`` records: per-second turn counts, the engine's series, and the run's phases.

``Recorder`` holds the turns' own counts (from each answer's ``usage``). ``EngineSeries`` turns one
scrape of the engine's ``/metrics`` a second into the series ``simulator run`` writes for its
simulated engine (simulator/agent.py ``SERIES_FIELDS``), with the same meaning, so that
`simulator.warning_eval`'s replay reads a live run as it reads an offline one:

* gauges as scraped: ``kv_usage``, ``running``, ``waiting``;
* per-second deltas: ``engine_queries``, ``engine_hits`` (prefix-cache queries and hits);
* cumulative counters since the run's first scrape (vLLM's counters count from the engine's start,
  the simulator's from the run's): ``preemptions``, ``engine_prompt_tokens``,
  ``engine_cached_tokens``, ``generation_tokens``.

A scrape that failed, or a counter the engine does not export, is ``None`` for that second (a gap),
never a zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.engine_metrics import EngineSnapshot
from core.runs import window_ratio
from simulator.config import AgentWorkload

WINDOW_S = 60
# series key -> EngineSnapshot counter, recorded as the increase since the run's first scrape
CUMULATIVE = {
    "preemptions": "preemptions",
    "engine_prompt_tokens": "prompt_tokens",
    "engine_cached_tokens": "cached_tokens",
    "generation_tokens": "generation_tokens",
}
# series key -> EngineSnapshot counter, recorded as the increase over the last second
PER_SECOND = {"engine_queries": "prefix_cache_queries", "engine_hits": "prefix_cache_hits"}
GAUGES = {"kv_usage": "kv_usage", "running": "requests_running", "waiting": "requests_waiting"}


@dataclass
class Recorder:
    """Per-second raw counts; index s covers wall time (s, s + 1] since the run started."""

    n: int
    turns: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    hit_turns: list[int] = field(default_factory=list)
    errors: int = 0
    retries: int = 0

    def __post_init__(self) -> None:
        self.turns, self.prompt, self.cached, self.hit_turns = ([0] * self.n for _ in range(4))

    def add(self, t: float, prompt: int, cached: int) -> None:
        if t > self.n:
            return
        s = min(self.n - 1, max(0, math.ceil(t) - 1))
        self.turns[s] += 1
        self.prompt[s] += prompt
        self.cached[s] += cached
        self.hit_turns[s] += cached > 0


@dataclass
class EngineSeries:
    """The engine's per-second series from its scrapes (module doc)."""

    first: EngineSnapshot | None = None
    last: EngineSnapshot | None = None

    def append(self, series: dict[str, list[Any]], snap: EngineSnapshot | None) -> None:
        if snap is not None and self.first is None:
            self.first = snap
        for key, attr in GAUGES.items():
            series[key].append(None if snap is None else getattr(snap, attr))
        for key, attr in CUMULATIVE.items():
            series[key].append(_since(snap, self.first, attr))
        for key, attr in PER_SECOND.items():
            delta = _since(snap, self.last, attr)
            series[key].append(0.0 if delta is None else max(0.0, delta))
        if snap is not None:
            self.last = snap


def _since(snap: EngineSnapshot | None, base: EngineSnapshot | None, attr: str) -> float | None:
    now = None if snap is None else getattr(snap, attr)
    then = None if base is None else getattr(base, attr)
    return None if now is None or then is None else now - then


def phases(
    rec: Recorder, a: AgentWorkload, control_start_min: float, minutes: float, preemptions: list[Any]
) -> dict[str, dict[str, Any]]:
    """R_t, turns/s and engine preemptions before the burst, between the burst and the control, and at the end."""
    b0 = a.burst_start_min * 60.0
    b1 = b0 + a.burst_minutes * 60.0
    c = control_start_min * 60.0
    end = minutes * 60.0
    spans = {
        "before": (0.0, min(b0, end)),
        "during": (b1, c) if c > b1 else (b0, min(b1, end)),
        "after": (max(c, end - 120.0), end),
    }

    def at(t: float) -> Any:
        i = min(len(preemptions) - 1, max(0, int(t) - 1))
        return preemptions[i] if preemptions else None

    out: dict[str, dict[str, Any]] = {}
    for name, (lo, hi) in spans.items():
        if hi <= lo:
            continue
        tw = window_ratio(rec.cached, rec.prompt, lo, hi)
        turns = sum(rec.turns[int(lo) : int(hi)])
        p_lo, p_hi = at(lo), at(hi)
        out[name] = {
            "from_s": lo,
            "to_s": hi,
            "token_weighted": None if tw is None else round(tw, 4),
            "turns_per_s": round(turns / (hi - lo), 4),
            "preemptions": None if p_lo is None or p_hi is None else p_hi - p_lo,
        }
    return out


def trailing(values: list[Any], window: int = WINDOW_S) -> list[float]:
    """Sum over the trailing ``window`` seconds at each second (gaps count as 0)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v or 0
        if i >= window:
            acc -= values[i - window] or 0
        out.append(acc)
    return out


def ratio(num: list[float], den: list[float]) -> list[float | None]:
    return [None if d <= 0 else round(n / d, 4) for n, d in zip(num, den, strict=True)]
