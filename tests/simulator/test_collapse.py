"""Seeded collapse and recovery from mechanism: the burst tips the engine into the persistent degraded state;
``off`` stays there, ``budgeter-park`` (the project's own core.budgeter) brings it back within 5 minutes."""

from __future__ import annotations

import pytest

from simulator.offline import run_scenario, scenario_config

SEED = 2  # a seed whose burst run collapses before minute 20 with the default calibration
MINUTES = 35


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    # "off" runs the full 90 minutes: the criteria are judged at minute 90 (a fast-mode run takes < 1 s)
    return {
        control: run_scenario("agent-burst", control, SEED, 90 if control == "off" else MINUTES)
        for control in ("off", "admission-only", "budgeter-park", "session-cap-park")
    }


def test_the_burst_collapses_the_engine_and_nothing_recovers_without_parking(runs: dict[str, dict]) -> None:
    off = runs["off"]["summary"]
    assert off["collapsed"] and not off["recovered"] and off["degraded_at_end"]
    assert off["end_hit_ratio"] <= 0.2
    # under half the offered load (arrival_rate x turns; the burst's extra sessions not counted)
    assert off["end_turns_per_s"] < 0.5 * off["steady_offered_turns_per_s"]
    assert off["sessions_slope_per_min"] > 0  # the backlog keeps growing
    series = runs["off"]["series"]
    assert max(series["sessions_in_system"]) > 60
    # the vLLM usage gauge never shows the cache residency the collapse is about
    assert series["kv_resident"][-1] > 0.9


def test_budgeter_park_recovers_within_five_minutes(runs: dict[str, dict]) -> None:
    s = runs["budgeter-park"]["summary"]
    assert s["collapsed"] and s["recovered"]
    assert s["minutes_to_recover"] <= 5
    assert s["end_hit_ratio"] >= 0.9
    assert max(runs["budgeter-park"]["series"]["parked"]) > 0


def test_session_cap_park_recovers_and_admission_only_does_not(runs: dict[str, dict]) -> None:
    assert runs["session-cap-park"]["summary"]["recovered"]
    assert not runs["admission-only"]["summary"]["recovered"]


def test_steady_run_of_the_same_seed_stays_healthy() -> None:
    s = run_scenario("agent-steady", "off", SEED, MINUTES)["summary"]
    assert not s["collapsed"] and not s["degraded_at_end"] and s["end_hit_ratio"] >= 0.9


def test_the_burst_is_a_fixed_number_of_extra_sessions() -> None:
    # burst_process=uniform (the default): burst_rate * window sessions, one per equal slot, whatever the seed
    agent = scenario_config("agent-burst").agent
    extra = round(agent.burst_rate * agent.burst_minutes * 60)
    assert extra >= 15  # at least the published burst size
    for seed in (0, 1, 2):
        burst = run_scenario("agent-burst", "off", seed, 11)["summary"]["sessions_arrived"]
        steady = run_scenario("agent-steady", "off", seed, 11)["summary"]["sessions_arrived"]
        assert burst - steady == extra
