"""The validation harness's judgement (simulator.forecast_validate): the issue's tolerance, exactly."""

from __future__ import annotations

from simulator import forecast_validate
from simulator.forecast_validate import actual_r_t, parked_lead_s, within


def test_r_t_within_a_tenth_and_parked_within_30_percent_or_3_sessions() -> None:
    assert within({"r_t": 0.85, "parked_end": 13}, {"r_t": 0.95, "parked_end": 10}) == {
        "r_t": True,
        "parked": True,
    }
    assert within({"r_t": 0.84, "parked_end": 14}, {"r_t": 0.95, "parked_end": 10}) == {
        "r_t": False,
        "parked": False,
    }  # 0.11 apart; 4 sessions off when 3 are allowed (30% of 10 is less)
    assert within({"r_t": 0.5, "parked_end": 26}, {"r_t": 0.5, "parked_end": 20})["parked"]  # 30% of 20 = 6
    assert not within({"r_t": 0.5, "parked_end": 27}, {"r_t": 0.5, "parked_end": 20})["parked"]
    assert within({"r_t": None, "parked_end": 0}, {"r_t": 0.5, "parked_end": 0}) == {
        "r_t": False,
        "parked": True,
    }


def test_actual_r_t_is_token_weighted_over_ok_turns() -> None:
    turns = [
        {"prompt_tokens": 1000, "cached_tokens": 900, "outcome": "ok"},
        {"prompt_tokens": 3000, "cached_tokens": 3500, "outcome": "ok"},  # cached never above prompt
        {"prompt_tokens": 5000, "cached_tokens": 0, "outcome": "error"},
    ]
    assert actual_r_t(turns) == round(3900 / 4000, 4)
    assert actual_r_t([]) is None


def test_the_truth_run_is_the_same_preview_on_the_simulated_engines_own_cost_model() -> None:
    import dataclasses
    from types import SimpleNamespace

    from core.budgeter import BudgeterConfig
    from simulator.config import CostModel, EngineConfig
    from simulator.forecast import ForecastInputs, Shapes, StartSession
    from simulator.forecast_run import run_forecast
    from simulator.forecast_validate import true_cost_preview

    speed = 10.0
    truth = CostModel(**{f.name: getattr(CostModel(), f.name) / speed for f in dataclasses.fields(CostModel)})
    inputs = ForecastInputs(
        engine=EngineConfig(pool_tokens=100_000),
        cost=CostModel(0.01, 1e-5, 0.0, 1e-8, 0.0),  # the estimate: slower than the truth at x10
        cost_source="latencies",
        sessions=(StartSession("s", "admitted", 5000, 1),),
        shapes=Shapes(0.0, (), (100,), (10,), (1.0,), (10_000,), 0, 10),
        output_budget=10,
    )
    park = BudgeterConfig(mode="budgeter-park")
    est = run_forecast(inputs, park, 1, 0)
    on_truth = run_forecast(dataclasses.replace(inputs, cost=truth), park, 1, 0)["summary"]
    job = SimpleNamespace(
        inputs=inputs, configs=(BudgeterConfig(), park), minutes=1, seed=0, draws=1, results=[{}, est]
    )
    out = true_cost_preview(job, speed)
    assert out["preview_truth"] == {
        k: on_truth[k] for k in ("r_t", "turns_per_s", "parked_end", "p95_turn_latency_s")
    }
    assert out["truth_speed_ratio"] == round(est["summary"]["turns_per_s"] / on_truth["turns_per_s"], 3) < 1


def test_parked_lead_is_the_shift_that_matches_the_preview_to_what_happened() -> None:
    drain = [max(0, 300 - t) for t in range(1, 301)]  # one session a second, 0 at 300 s
    live = [(t, max(0, 300 - t)) for t in range(2, 301, 2)]
    assert parked_lead_s(live, drain, from_s=150) == 0.0
    # the preview drains 3 s early: at t it shows what happened at t + 3
    early = [max(0, 297 - t) for t in range(1, 301)]
    assert parked_lead_s(live, early, from_s=150) == 3.0
    late = [max(0, 301.5 - t) for t in range(1, 301)]
    assert parked_lead_s(live, late, from_s=150) == -1.5
    # between the preview's seconds: interpolated; only samples from `from_s` on count
    live_half = [(151.0, 149), (200.5, 99.5), (10.0, 0)]
    assert parked_lead_s(live_half, drain, from_s=150) == 0.0
    # no sample to compare, or no preview
    assert parked_lead_s([(10.0, 5)], drain, from_s=150) is None
    assert parked_lead_s(live, [], from_s=150) is None
    # a flat stretch matches every shift alike: the smallest wins
    assert parked_lead_s([(200.0, 7), (250.0, 7)], [7] * 300, from_s=150) == 0.0


def test_the_preview_starts_from_the_collectors_next_sample_not_their_latest(monkeypatch) -> None:
    from dashboard import data

    samples = iter([{"ts": 100.0}, {"ts": 100.0}, {"ts": 100.0}, {"ts": 101.0, "fresh": True}])
    monkeypatch.setattr(data, "clear_caches", lambda: None)
    monkeypatch.setattr(data, "sidecar_states", lambda url: {7: next(samples)})
    monkeypatch.setattr(forecast_validate.time, "sleep", lambda s: None)
    assert forecast_validate._next_sample("sqlite://", 7) == {"ts": 101.0, "fresh": True}

    # no new sample within the wait: the latest one
    monkeypatch.setattr(data, "sidecar_states", lambda url: {7: {"ts": 100.0}})
    assert forecast_validate._next_sample("sqlite://", 7, timeout=0.01) == {"ts": 100.0}
