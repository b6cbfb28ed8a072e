"""Live panels refresh at an interval adapted to their measured run time (`dashboard.live`)."""

from __future__ import annotations

import pytest

from dashboard import live
from tests.dashboard.apptest import app, texts


def test_next_interval_exact_values() -> None:
    assert live.next_interval(2.0, []) == 2.0  # nothing measured: the configured refresh
    assert live.next_interval(2.0, [0.3, 0.4]) == 2.0  # fast runs: the configured refresh
    assert live.next_interval(2.0, [0.4, 1.2]) == 3.0  # 2 x 1.2 s rounded up to a whole second
    assert live.next_interval(2.0, [6.5, 0.2, 0.3]) == 13.0  # the slowest of the last 3 runs
    assert live.next_interval(2.0, [6.5, 0.2, 0.3, 0.2]) == 2.0  # older runs are forgotten
    assert live.next_interval(2.0, [45.0]) == live.MAX_INTERVAL == 60.0
    assert live.next_interval(5.0, [1.0]) == 5.0  # never faster than configured


class StepClock:
    """The run timer of `dashboard.live`: every run measures `step` seconds, whatever the machine's load."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step / 2
        return self.t


def test_a_slow_page_refreshes_slower_and_says_why(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "_clock", StepClock(0.5))
    at = app("engine", engine="a")
    assert "Refreshing every" not in texts(at)
    at.session_state["live_panel_runs"] = {"engine": [4.2]}  # a run measured at 4.2 s on a busy server
    at.run()
    assert not at.exception, at.exception
    assert "Refreshing every 9 s instead of 2 s" in texts(at)
    assert at.session_state["live_panel_interval"]["engine"] == pytest.approx(9.0)


def test_a_paused_page_does_not_refresh(db_url: str) -> None:
    at = app("engine", engine="a", range="1h", to="1800000000")
    assert at.session_state["live_panel_interval"]["engine"] is None
