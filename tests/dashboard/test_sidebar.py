"""The sidebar's "N/M targets up" agrees with the target-down alert (issue 13 item 1)."""

from __future__ import annotations

from dashboard.frames import TargetHealth
from dashboard.sidebar import targets_up


def health(tid: int, up: bool) -> TargetHealth:
    return TargetHealth(tid, "engine", f"t{tid}", f"u{tid}", up, 1.0, 1.0, None, 0)


def test_a_target_is_down_when_its_scrape_failed_or_target_down_fires() -> None:
    targets = {1: health(1, True), 2: health(2, False), 3: health(3, True)}
    assert targets_up(targets, set()) == (2, 3, ["t2"])
    # the last scrape answered but the alert still fires (frozen engine): not counted up
    assert targets_up(targets, {3}) == (1, 3, ["t2", "t3"])
    assert targets_up({}, set()) == (0, 0, [])
