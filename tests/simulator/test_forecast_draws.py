"""A forecast of several draws (simulator.forecast_draws): exact medians and ranges, and the draw rule."""

from __future__ import annotations

from core.budgeter import BudgeterConfig
from simulator.config import CostModel, EngineConfig
from simulator.forecast import ForecastInputs, Shapes, StartSession
from simulator.forecast_draws import MAX_DRAWS, combine, draws_for, run_draws
from simulator.forecast_run import run_forecast


def _result(parked_end: int, r_t: float | None, parked: list[int]) -> dict:
    return {
        "summary": {"mode": "budgeter-park", "parked_end": parked_end, "r_t": r_t, "minutes": 5},
        "series": {"parked": parked},
    }


def test_combine_takes_each_numbers_median_and_range_and_the_series_median_per_second() -> None:
    out = combine([_result(15, 0.91, [1, 9]), _result(34, 0.93, [3, 2]), _result(17, 0.92, [2, 4])])
    assert out["summary"] == {
        "mode": "budgeter-park",
        "parked_end": 17,
        "r_t": 0.92,
        "minutes": 5,
        "draws": 3,
    }
    assert out["spread"] == {"parked_end": [15, 34], "r_t": [0.91, 0.93]}  # the minutes are the run's
    assert out["series"] == {"parked": [2, 4]}
    # a field some draw has none of is the first draw's, with no range
    odd = combine([_result(1, None, [0]), _result(2, 0.5, [0]), _result(3, 0.7, [0])])
    assert (odd["summary"]["r_t"], "r_t" in odd["spread"]) == (None, False)


def test_draws_fit_in_90_simulated_minutes_per_config_and_are_odd() -> None:
    assert [draws_for(m) for m in (5, 15, 20, 30, 44, 45, 60, 360)] == [5, 5, 3, 3, 1, 1, 1, 1]
    assert draws_for(0) == MAX_DRAWS


def test_run_draws_is_the_combination_of_consecutive_seeds() -> None:
    inputs = ForecastInputs(
        engine=EngineConfig(pool_tokens=200_000),
        cost=CostModel(0.006, 3e-5, 0.0, 4e-8, 0.0),
        cost_source="fit",
        sessions=tuple(StartSession(f"c{i}", "admitted", 12000, 2) for i in range(12)),
        shapes=Shapes(0.05, (12000,), (600, 900), (150,), (1.0, 3.0), (10, 40), 0, 10),
        output_budget=150,
    )
    cfg = BudgeterConfig(mode="budgeter-park")
    seen: list[float] = []
    got = run_draws(inputs, cfg, 2, seed=7, draws=3, progress=seen.append)
    want = combine([run_forecast(inputs, cfg, 2, seed) for seed in (7, 8, 9)])
    drop = ("wall_s",)
    assert {k: v for k, v in got["summary"].items() if k not in drop} == {
        k: v for k, v in want["summary"].items() if k not in drop
    }
    assert got["series"] == want["series"] and (got["summary"]["draws"], got["summary"]["seed"]) == (3, 7)
    assert seen[-1] == 1.0 and seen == sorted(seen)  # progress over the three draws
