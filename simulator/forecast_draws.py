"""A forecast of several draws: the median and the range (``run_draws``), not one draw taken for the answer.

A forecast draws its new sessions, their sizes and tool gaps at random (``simulator.forecast_run``); one
draw is one possible next N minutes. How much they differ is what an operator must see before trusting a
number: on the validation's recovery from a collapse (250 sessions, five minutes), the same inputs on
the simulated engine's own cost model gave 15, 34 and 17 parked sessions at the end for three draws
(docs/dashboard.md, "Validation"). So the preview runs ``draws_for(minutes)`` draws per config, seeds
``seed``, ``seed + 1``, ... (draw ``i`` offers the same sessions to every config), and reports:

* ``summary``: every numeric field of the draws' summaries, the median (an odd number of draws: the
  median is one of them); the run's settings (``SETTINGS``: the bands, the minutes, the first draw's
  seed) and other fields from the first draw; ``draws``, how many;
* ``spread``: ``[min, max]`` over the draws of each numeric field;
* ``series``: each per-second series, the median at each second.

``draws_for``: as many draws as fit in ``DRAW_MINUTES`` simulated minutes per config, odd, from 1 to
``MAX_DRAWS``: five up to 18 minutes, three up to half an hour (within the 2 s the issue allows a
30-minute forecast at the collapse demo's traffic, `bench/bench_forecast.py`), one beyond (a 6-hour
forecast stays one draw, within its 10 s).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from core.budgeter import BudgeterConfig
from simulator.forecast import ForecastInputs
from simulator.forecast_run import run_forecast

DRAW_MINUTES = 90.0
MAX_DRAWS = 5
SETTINGS = ("low", "high", "minutes", "seed")  # a summary's fields that are the run's, not a draw's


def draws_for(minutes: float) -> int:
    """Draws per config for a forecast of ``minutes`` (module doc)."""
    n = int(DRAW_MINUTES // minutes) if minutes > 0 else MAX_DRAWS
    n = max(1, min(MAX_DRAWS, n))
    return n if n % 2 else n - 1


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The draws of one config as one result (module doc); ``results`` are ``run_forecast``'s, in draw order."""
    summaries = [r["summary"] for r in results]
    summary = dict(summaries[0])
    spread: dict[str, list[float]] = {}
    for key, first in summaries[0].items():
        values = [s.get(key) for s in summaries]
        if key not in SETTINGS and _numeric(first) and all(_numeric(v) for v in values):
            summary[key] = statistics.median_low(values)
            spread[key] = [min(values), max(values)]
    summary["draws"] = len(results)
    series = {
        name: [statistics.median_low(at) for at in zip(*(r["series"][name] for r in results), strict=True)]
        for name in results[0]["series"]
    }
    return {"summary": summary, "spread": spread, "series": series}


def run_draws(
    inputs: ForecastInputs,
    config: BudgeterConfig,
    minutes: float,
    seed: int = 0,
    draws: int = 1,
    progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """``draws`` runs of ``run_forecast`` (seeds ``seed`` on), combined (module doc)."""
    results = []
    for i in range(draws):
        step = None if progress is None else (lambda p, i=i: progress((i + p) / draws))
        results.append(run_forecast(inputs, config, minutes, seed + i, progress=step))
    return combine(results)
