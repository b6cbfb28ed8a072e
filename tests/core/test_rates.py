import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.rates import counter_delta, counter_rate, ratio


@pytest.mark.parametrize(
    ("prev", "cur", "expected"),
    [
        (10.0, 15.0, 5.0),
        (10.0, 10.0, 0.0),
        (None, 5.0, None),  # first sample: nothing to compare with
        (10.0, 3.0, None),  # engine restarted: no rate for this interval
        (10.0, math.nan, None),
        (math.inf, 5.0, None),
    ],
)
def test_counter_delta(prev, cur, expected):
    assert counter_delta(prev, cur) == expected


def test_restart_detected_by_start_time_even_when_value_grew():
    # The engine restarted and counted past the old value before the next scrape.
    assert counter_delta(100.0, 250.0, prev_start=1000.0, cur_start=2000.0) is None
    assert counter_delta(100.0, 250.0, prev_start=1000.0, cur_start=1000.0) == 150.0


def test_rate_is_per_second_and_gaps_stay_gaps():
    assert counter_rate(0.0, 10.0, 30.0, 12.0) == 15.0
    assert counter_rate(0.0, 10.0, 30.0, 100.0, max_gap_s=5.0) is None
    assert counter_rate(0.0, 10.0, 30.0, 10.0) is None  # no time passed
    assert counter_rate(5.0, None, 30.0, 10.0) is None


@given(st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False), min_size=2, max_size=50))
def test_rates_never_negative_whatever_the_counter_does(values):
    for i in range(1, len(values)):
        rate = counter_rate(values[i - 1], float(i - 1), values[i], float(i))
        assert rate is None or rate >= 0


@given(st.floats(allow_nan=True), st.floats(allow_nan=True))
def test_ratio_is_a_fraction_or_none(num, den):
    value = ratio(num, den)
    assert value is None or 0.0 <= value <= 1.0


def test_ratio_of_empty_interval_is_unknown_not_zero():
    assert ratio(0.0, 0.0) is None
    assert ratio(3.0, 4.0) == 0.75
