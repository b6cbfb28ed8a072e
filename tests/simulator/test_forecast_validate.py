"""The validation harness's judgement (simulator.forecast_validate): the issue's tolerance, exactly."""

from __future__ import annotations

from simulator.forecast_validate import actual_r_t, within


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
