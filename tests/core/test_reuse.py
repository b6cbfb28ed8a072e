"""core/reuse.py: R_t, R_r, D over time and last-N windows; unknown turns; thin-reuse hysteresis."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.reuse import (
    LastTurns,
    RegimeConfig,
    RegimeDetector,
    ReuseConfigError,
    TimeWindow,
    Turn,
    next_regime,
    normalise_turn,
    regime_verdict,
    stats_of,
)


@st.composite
def turns(draw: st.DrawFn, max_size: int = 60) -> list[Turn]:
    n = draw(st.integers(0, max_size))
    t = 0.0
    out = []
    for _ in range(n):
        t += draw(st.floats(0, 5, allow_nan=False))
        prompt = draw(st.integers(0, 50_000))
        cached = draw(st.one_of(st.none(), st.integers(0, prompt)))
        out.append(Turn(t, prompt, cached))
    return out


@settings(max_examples=200, deadline=None)
@given(turns())
def test_rates_are_fractions_and_divergence_is_their_difference(sample: list[Turn]) -> None:
    s = stats_of(sample)
    assert s.turns == len(sample)
    assert s.known_turns + s.unknown_turns == s.turns
    if s.known_turns == 0:
        assert s.token_weighted is None and s.request_weighted is None and s.divergence is None
        return
    assert s.token_weighted is not None and s.request_weighted is not None and s.divergence is not None
    assert 0.0 <= s.token_weighted <= 1.0
    assert 0.0 <= s.request_weighted <= 1.0
    assert math.isclose(s.divergence, s.request_weighted - s.token_weighted)
    assert s.low_cached_fraction is not None and 0.0 <= s.low_cached_fraction <= 1.0


@settings(max_examples=200, deadline=None)
@given(turns(), st.floats(0.5, 30, allow_nan=False))
def test_time_window_agrees_with_the_reference(sample: list[Turn], window_s: float) -> None:
    w = TimeWindow(window_s)
    for i, turn in enumerate(sample):
        w.add(turn)
        now = turn.t
        expected = stats_of(x for x in sample[: i + 1] if now - x.t < window_s)
        assert w.stats(now) == expected


@settings(max_examples=200, deadline=None)
@given(turns(), st.integers(1, 20))
def test_last_turns_agrees_with_the_reference(sample: list[Turn], n: int) -> None:
    w = LastTurns(n)
    for i, turn in enumerate(sample):
        w.add(turn)
        assert w.stats() == stats_of(sample[max(0, i + 1 - n) : i + 1])


def test_unknown_turns_are_not_misses() -> None:
    known = [Turn(0, 1000, 900), Turn(1, 1000, 900)]
    with_unknown = [*known, Turn(2, 1000, None), Turn(3, 5000, None)]
    a, b = stats_of(known), stats_of(with_unknown)
    assert (a.token_weighted, a.request_weighted) == (b.token_weighted, b.request_weighted)
    assert b.unknown_turns == 2 and b.known_turns == 2


def test_storm_of_short_requests_diverges() -> None:
    # docs/architecture.md: R_r ~0.9 while R_t ~0.1 under a storm of short low-overlap requests.
    storm = [Turn(i, 1000, 100) for i in range(9)] + [Turn(9, 1000, 0)]
    s = stats_of(storm)
    assert s.request_weighted == pytest.approx(0.9)
    assert s.token_weighted == pytest.approx(0.09)
    assert s.divergence == pytest.approx(0.81)
    assert s.low_cached_fraction == 1.0


def test_time_window_expires_old_turns() -> None:
    w = TimeWindow(60)
    w.add(Turn(0, 100, 100))
    w.add(Turn(30, 100, 0))
    assert w.stats(59).turns == 2
    assert w.stats(60).turns == 1
    assert w.stats(90).turns == 0
    assert w.stats(90).token_weighted is None


def test_normalise_turn_caps_engine_nonsense() -> None:
    assert normalise_turn(0, 100, 150) == Turn(0, 100, 100)
    assert normalise_turn(0, -5, -1) == Turn(0, 0, 0)
    assert normalise_turn(0, 10, None).cached_tokens is None


@pytest.mark.parametrize(
    "kwargs",
    [dict(enter=0.4, exit=0.5), dict(enter=float("nan")), dict(min_turns=0), dict(exit=float("inf"))],
)
def test_regime_config_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ReuseConfigError):
        RegimeConfig(**kwargs)


def stats_with(d_target: float, n: int) -> object:
    """n known turns whose divergence is about d_target (all hits, R_t = 1 - d)."""
    cached = round(1000 * (1 - d_target))
    return stats_of(Turn(i, 1000, max(1, cached)) for i in range(n))


def test_regime_hysteresis_enter_above_0_5_exit_below_0_4() -> None:
    cfg = RegimeConfig(enter=0.5, exit=0.4, min_turns=20)
    assert next_regime("normal", stats_with(0.45, 50), cfg) == "normal"
    assert next_regime("normal", stats_with(0.55, 50), cfg) == "thin-reuse"
    assert next_regime("thin-reuse", stats_with(0.45, 50), cfg) == "thin-reuse"
    assert next_regime("thin-reuse", stats_with(0.35, 50), cfg) == "normal"


def test_regime_enters_at_exactly_the_enter_threshold_and_holds_at_exit() -> None:
    """One comparison everywhere (README, Definitions): entered when D >= 0.5, left when D < 0.4."""
    cfg = RegimeConfig()
    at_enter = stats_of([Turn(i, 100, 50) for i in range(20)])
    assert at_enter.divergence == 0.5 and at_enter.known_turns == 20
    assert next_regime("normal", at_enter, cfg) == "thin-reuse"
    at_exit = stats_of([Turn(i, 100, 60) for i in range(20)])
    assert at_exit.divergence == 0.4
    assert next_regime("thin-reuse", at_exit, cfg) == "thin-reuse"
    assert regime_verdict(0.5, 20, cfg) == "enter"
    assert regime_verdict(0.4999, 20, cfg) == "hold"
    assert regime_verdict(0.4, 20, cfg) == "hold"
    assert regime_verdict(0.3999, 20, cfg) == "exit"
    assert regime_verdict(0.9, 19, cfg) is None
    assert regime_verdict(None, 100, cfg) is None


def test_regime_not_judged_below_min_turns() -> None:
    cfg = RegimeConfig(min_turns=20)
    assert next_regime("normal", stats_with(0.9, 19), cfg) == "normal"
    assert next_regime("thin-reuse", stats_with(0.0, 19), cfg) == "thin-reuse"
    assert next_regime("normal", stats_with(0.9, 20), cfg) == "thin-reuse"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=50))
def test_regime_never_flaps_inside_the_band(divergences: list[float]) -> None:
    """A regime change needs D to cross the far threshold: no flip-flop on values between exit and enter."""
    det = RegimeDetector(RegimeConfig(enter=0.5, exit=0.4, min_turns=1))
    previous = det.regime
    for d in divergences:
        s = stats_with(min(max(d, 0.0), 0.999), 5)
        regime = det.update(s)
        if regime != previous:
            assert s.divergence is not None
            if regime == "thin-reuse":
                assert s.divergence >= 0.5
            else:
                assert s.divergence < 0.4
        previous = regime
