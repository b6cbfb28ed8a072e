"""Judging a run: degraded, collapsed, recovered, minutes to recover, end hit ratio.

Pure functions over per-second counts (no I/O, no clock). One definition for
the offline simulator, the table-3 experiment and the collectors' collapse
alert, so every control is measured the same way (issue 3, "Definitions"):

* ``token_weighted`` over a window = cached prompt tokens / prompt tokens of
  the turns that *completed* in it.
* A run is **degraded at minute m** when ``token_weighted`` over minutes
  ``[m - 5, m]`` is <= 0.3. A window with no completed turn counts as degraded
  when sessions are in the system (work offered, nothing served), else not.
* **Collapsed** = degraded at ``control_start_min``.
* **Recovered** = collapsed, and from some minute ``r > control_start_min``
  until the end of the run it is never degraded again;
  ``minutes_to_recover = r - control_start_min`` (whole minutes).
* ``end_hit_ratio`` = ``token_weighted`` over the last 5 minutes.

Inputs are sequences indexed by second: entry ``s`` covers simulated time
``(s, s + 1]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

DEGRADED_THRESHOLD = 0.3
WINDOW_MIN = 5.0


def window_ratio(num: Sequence[float], den: Sequence[float], start_s: float, end_s: float) -> float | None:
    """sum(num) / sum(den) over seconds in ``[start_s, end_s)`` (clipped to the data); None when den is 0."""
    lo = max(0, int(math.floor(start_s)))
    hi = min(len(den), int(math.ceil(end_s)))
    if hi <= lo:
        return None
    d = float(sum(den[lo:hi]))
    if d <= 0:
        return None
    return float(sum(num[lo:hi])) / d


def is_degraded(
    token_weighted: float | None, sessions_in_system: float = 1.0, threshold: float = DEGRADED_THRESHOLD
) -> bool:
    """The degraded test on one window's token-weighted hit rate (see the module doc)."""
    if token_weighted is None:
        return sessions_in_system > 0
    return token_weighted <= threshold


def degraded_minutes(
    prompt: Sequence[float],
    cached: Sequence[float],
    sessions: Sequence[float],
    minutes: float,
    window_min: float = WINDOW_MIN,
    threshold: float = DEGRADED_THRESHOLD,
) -> list[int]:
    """Whole minutes m in [1, minutes] at which the run is degraded."""
    out = []
    for m in range(1, int(math.floor(minutes)) + 1):
        tw = window_ratio(cached, prompt, (m - window_min) * 60.0, m * 60.0)
        idx = min(len(sessions) - 1, m * 60 - 1) if sessions else -1
        in_system = float(sessions[idx]) if idx >= 0 else 0.0
        if is_degraded(tw, in_system, threshold):
            out.append(m)
    return out


def slope_per_min(values: Sequence[float], start_s: float, end_s: float) -> float:
    """Least-squares slope (per minute) of ``values`` over seconds [start_s, end_s)."""
    lo = max(0, int(start_s))
    hi = min(len(values), int(end_s))
    n = hi - lo
    if n < 2:
        return 0.0
    xs = range(lo, hi)
    mx = (lo + hi - 1) / 2.0
    my = sum(values[lo:hi]) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (values[x] - my) for x in xs)
    return 60.0 * sxy / sxx if sxx > 0 else 0.0


@dataclass(frozen=True)
class RunVerdict:
    collapsed: bool
    recovered: bool
    minutes_to_recover: int | None
    end_hit_ratio: float | None
    degraded_at: list[int] = field(default_factory=list)
    degraded_at_end: bool = False
    end_turns_per_s: float = 0.0
    end_sessions_in_system: float = 0.0
    sessions_slope_per_min: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def judge_run(
    prompt: Sequence[float],
    cached: Sequence[float],
    turns: Sequence[float],
    sessions: Sequence[float],
    *,
    control_start_min: float,
    minutes: float,
    window_min: float = WINDOW_MIN,
    threshold: float = DEGRADED_THRESHOLD,
) -> RunVerdict:
    """The verdict on one run from its per-second counts (see the module doc)."""
    degraded = degraded_minutes(prompt, cached, sessions, minutes, window_min, threshold)
    degraded_set = set(degraded)
    start = int(round(control_start_min))
    last_minute = int(math.floor(minutes))
    collapsed = start in degraded_set
    recovered = False
    to_recover: int | None = None
    if collapsed:
        last_bad = max(m for m in degraded if m >= start)
        if last_bad < last_minute:
            recovered = True
            to_recover = last_bad + 1 - start
    end_s = minutes * 60.0
    end_hit = window_ratio(cached, prompt, end_s - window_min * 60.0, end_s)
    end_turns = window_ratio(turns, [1.0] * len(turns), end_s - window_min * 60.0, end_s) or 0.0
    end_sessions = float(sessions[-1]) if sessions else 0.0
    slope = slope_per_min(sessions, end_s - 15 * 60.0, end_s)
    return RunVerdict(
        collapsed=collapsed,
        recovered=recovered,
        minutes_to_recover=to_recover,
        end_hit_ratio=None if end_hit is None else round(end_hit, 4),
        degraded_at=degraded,
        degraded_at_end=last_minute in degraded_set,
        end_turns_per_s=round(end_turns, 4),
        end_sessions_in_system=end_sessions,
        sessions_slope_per_min=round(slope, 4),
    )
