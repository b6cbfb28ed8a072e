"""core.projection: the projected demand of admitted sessions, exact values; and the budgeter's use of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from core.budgeter import Budgeter, BudgeterConfig
from core.projection import growth_per_turn, projected_demand, session_length


def sess(turns, context, demand, budget=1000):
    return SimpleNamespace(turns=turns, context_tokens=context, demand_tokens=demand, output_budget=budget)


# three admitted sessions; C has no finished turn yet (its first prompt, 6000, is in flight)
A = sess(2, 8000, 9000)
B = sess(4, 10000, 11000)
C = sess(0, 0, 7000)


def test_growth_per_turn_is_the_least_squares_slope_and_its_value_at_one_turn():
    assert growth_per_turn([A, B, C]) == (1000.0, 7000.0)
    assert growth_per_turn([A]) == (0.0, 8000.0)  # one turn count: no slope
    assert growth_per_turn([C]) == (0.0, 0.0)
    # shrinking contexts (compaction) never give a negative growth
    assert growth_per_turn([sess(1, 9000, 0), sess(3, 5000, 0)])[0] == 0.0


def test_sessions_due_to_end_leave_and_the_others_grow_at_the_current_pace():
    # 0.1 turns/s over 3 sessions: 2 turns each in 60 s. A grows +2000 and has 3 left of 5: stays, 11000;
    # B has 1 left: ends; C grows +2000: 9000; one arrival in the last 60 s: 60 s of arrivals at 1/60 per s,
    # each 7000 (context at one turn) + 1000 (mean budget)
    assert projected_demand([A, B, C], [95.0, 30.0, 20.0], 5.0, 0.1, 100.0, 60.0) == pytest.approx(28000.0)


def test_before_any_session_ended_sessions_last_as_long_as_the_oldest_so_far():
    # no session has ended yet: the oldest admitted one, B, has 4 turns and its next, so sessions last
    # at least 5: A has 3 left (stays, 11000), B 1 (ends), C 5 (stays, 9000); arrivals 8000, as with 5.0
    assert session_length([A, B, C], None) == 5.0
    assert session_length([A, B, C], 7.5) == 7.5
    assert session_length([], None) == 1.0
    assert projected_demand([A, B, C], [95.0, 30.0, 20.0], None, 0.1, 100.0, 60.0) == pytest.approx(28000.0)
    # sessions all on their first turn: each has its next turn, 1 left, and leaves if a turn fits
    young = [sess(0, 0, 7000), sess(0, 0, 5000)]
    assert projected_demand(young, [], None, 0.1, 100.0, 60.0) == 0.0
    assert projected_demand(young, [], None, 0.01, 100.0, 60.0) == pytest.approx(12000.0)  # 0.3 turns each


def test_a_stalled_engine_advances_nobody():
    # no turn completes: today's demand plus the arrivals
    assert projected_demand([A, B, C], [95.0], 5.0, 0.0, 100.0, 60.0) == pytest.approx(27000.0 + 8000.0)


def test_zero_horizon_is_todays_demand_and_bad_arguments_are_named():
    assert projected_demand([A, B, C], [], None, 0.1, 100.0, 0.0) == pytest.approx(27000.0)
    assert projected_demand([], [], None, 0.1, 100.0, 60.0) == 0.0
    with pytest.raises(ValueError, match="horizon must be >= 0.*got -1"):
        projected_demand([A], [], None, 0.1, 100.0, -1.0)


def test_budgeter_projects_from_the_turn_counts_of_ended_sessions():
    b = Budgeter(BudgeterConfig(mode="off"), pool_tokens=100_000)
    for sid, now in (("a", 0.0), ("b", 0.0)):
        assert b.request_turn(sid, now, 1000, 100) == "forward"
    for k in range(1, 5):  # "a" and "b" finish 4 turns, 10 s apart, growing 500 per turn
        for sid in ("a", "b"):
            b.turn_finished(sid, 10.0 * k, 1000 + 500 * (k - 1), 0)
            if k < 4:
                b.request_turn(sid, 10.0 * k, 1000 + 500 * k, 100)
    b.end_session("b", 40.0)  # ended after 4 turns: sessions last 4 turns
    assert b.request_turn("a", 40.0, 2500, 100) == "forward"
    # "a" (4 turns of 4: one left, its next) stays at horizon 0
    assert b.projected_demand_tokens(40.0, 0.0, 0.1) == b.demand_tokens() == 2500 + 100
    # at 0.1 turns/s its last turn fits in 30 s: it leaves; nobody arrived in the last 60 s at 70 s
    assert b.projected_demand_tokens(70.0, 30.0, 0.1) == 0
    # at 45 s it arrived within the last 60 s: 1/60 arrivals per s, each 2500 + 100
    assert b.projected_demand_tokens(45.0, 30.0, 0.1) == round(30.0 / 60.0 * (2500 + 100))
