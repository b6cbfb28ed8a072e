"""Run judging (core.runs): degraded windows, collapsed, recovered, minutes to recover, end hit ratio."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.runs import degraded_minutes, is_degraded, judge_run, slope_per_min, window_ratio


def per_second(
    minutes: int, rate_by_minute: dict[int, float], prompt: int = 1000
) -> tuple[list[int], list[int]]:
    """One 1000-token turn per second; cached fraction by minute (default 0.95)."""
    p, c = [], []
    for s in range(minutes * 60):
        p.append(prompt)
        c.append(int(prompt * rate_by_minute.get(s // 60, 0.95)))
    return p, c


def test_window_ratio_and_empty_windows() -> None:
    assert window_ratio([1, 2, 3], [2, 2, 2], 0, 3) == 1.0
    assert window_ratio([1, 2, 3], [2, 2, 2], 1, 2) == 1.0
    assert window_ratio([0, 0], [0, 0], 0, 2) is None
    assert window_ratio([1], [1], 5, 9) is None


def test_is_degraded_threshold_and_unknown_windows() -> None:
    assert is_degraded(0.3) and not is_degraded(0.31)
    assert is_degraded(None, sessions_in_system=4)  # work offered, nothing served
    assert not is_degraded(None, sessions_in_system=0)


def test_collapse_and_recovery_are_judged_from_the_trailing_five_minutes() -> None:
    rates = {m: 0.1 for m in range(8, 24)}  # collapsed from minute 8 to minute 24
    p, c = per_second(40, rates)
    sessions = [10] * len(p)
    v = judge_run(p, c, [1] * len(p), sessions, control_start_min=20, minutes=40)
    assert v.collapsed and v.recovered
    # [m-5, m] stays <= 0.3 until enough healthy minutes are in the window
    last_bad = max(v.degraded_at)
    assert v.minutes_to_recover == last_bad + 1 - 20
    assert 24 <= last_bad <= 27
    assert v.end_hit_ratio == 0.95 and not v.degraded_at_end


def test_not_recovered_when_degraded_at_the_end() -> None:
    p, c = per_second(30, {m: 0.1 for m in range(10, 30)})
    v = judge_run(p, c, [1] * len(p), [50] * len(p), control_start_min=20, minutes=30)
    assert v.collapsed and not v.recovered and v.minutes_to_recover is None and v.degraded_at_end


def test_not_collapsed_means_not_recovered() -> None:
    p, c = per_second(30, {})
    v = judge_run(p, c, [1] * len(p), [5] * len(p), control_start_min=20, minutes=30)
    assert not v.collapsed and not v.recovered and v.degraded_at == []


def test_sessions_slope() -> None:
    assert abs(slope_per_min([float(s) / 60 for s in range(600)], 0, 600) - 1.0) < 1e-9
    assert slope_per_min([3.0] * 100, 0, 100) == 0.0


@given(st.lists(st.tuples(st.integers(0, 5000), st.floats(0, 1)), min_size=60, max_size=600))
def test_degraded_minutes_agree_with_the_window_ratio(data: list[tuple[int, float]]) -> None:
    prompt = [p for p, _ in data]
    cached = [int(p * f) for p, f in data]
    sessions = [1] * len(prompt)
    minutes = len(prompt) / 60
    out = degraded_minutes(prompt, cached, sessions, minutes)
    for m in range(1, int(minutes) + 1):
        tw = window_ratio(cached, prompt, (m - 5) * 60, m * 60)
        assert (m in out) == (tw is None or tw <= 0.3)
        if tw is not None:
            assert 0.0 <= tw <= 1.0
