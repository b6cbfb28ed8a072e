"""The forecast's validation harness (issue 16 item 3) in the suite: one seed, a compressed schedule.

The protocol (docs/dashboard.md, "Validation") runs the live collapse demo under `off` for 10 wall minutes,
previews `budgeter-park` through the Budgeter page's code, applies it for real through the sidecar's
authenticated control API and compares after 5 wall minutes, on 3 seeds; its figures (3/3 within the
issue's tolerance) are in the docs, with the command.

The suite cannot hold that protocol (15 wall minutes a seed), and a compressed one does not meet the
tolerance reliably: in a young collapse (80-100 sessions) the preview, whose engine is 1.5-1.7x too fast,
lets parked sessions back too early (a CI run: parked 14 previewed against 52). So this test runs the same
harness on one seed at x20 with 2 wall minutes under `off` and 1 after the switch, and checks what the
compressed schedule does hold: the engine collapsed under `off`, the preview of `off` says so, the preview
of `budgeter-park` foresees the recovery that then happens, by parking sessions in both, and R_t within
the issue's 0.1. The tolerance function itself is tested on exact values.
"""

from __future__ import annotations

import argparse

import pytest

from simulator import forecast_validate
from tests.support import free_port

SEED = 2
WARM_MIN = 2.0  # wall minutes under `off` (the protocol: 10): 40 simulated minutes, the engine long collapsed
AFTER_MIN = 1.0  # wall minutes after the switch, and the preview's length (the protocol: 5)
SPEED = 20.0  # twice the collapse demo's time scale


def test_the_tolerance_is_the_issues() -> None:
    ok = {"r_t": True, "parked": True}
    assert forecast_validate.within({"r_t": 0.90, "parked_end": 13}, {"r_t": 0.80, "parked_end": 10}) == ok
    assert forecast_validate.within({"r_t": 0.91, "parked_end": 14}, {"r_t": 0.80, "parked_end": 10}) == {
        "r_t": False,
        "parked": False,
    }
    # 30% of 50 is 15 sessions, larger than 3
    assert forecast_validate.within({"r_t": 0.5, "parked_end": 65}, {"r_t": 0.5, "parked_end": 50}) == ok
    assert not forecast_validate.within({"r_t": 0.5, "parked_end": 66}, {"r_t": 0.5, "parked_end": 50})[
        "parked"
    ]
    assert not forecast_validate.within({"r_t": None, "parked_end": 0}, {"r_t": 0.5, "parked_end": 0})["r_t"]


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.xdist_group("heavy")
@pytest.mark.timeout(420)
def test_the_budgeter_park_preview_foresees_the_switched_demos_recovery(tmp_path) -> None:
    args = argparse.Namespace(
        seeds=[SEED], warm=WARM_MIN, after=AFTER_MIN, speed=SPEED, fit=None, parallel=False, data_dir=tmp_path
    )
    [r] = forecast_validate.run(args, [(free_port(), free_port())])
    print(f"seed {r['seed']}: preview {r['preview']}, actual {r['actual']}, within {r['within']}")
    assert r["seed"] == SEED
    assert r["cost_source"] == "latencies", r  # no fit file: the estimate from the recorded signals
    assert r["preview_off"]["r_t"] < 0.5, r  # the engine had collapsed, and the preview of `off` says so
    assert r["actual"]["r_t"] > 0.5, r  # budgeter-park, applied for real, brought it back
    assert r["preview"]["r_t"] > r["preview_off"]["r_t"] + 0.3, r  # and the preview foresaw it
    assert r["within"]["r_t"], r  # within the issue's 0.1
    assert r["preview"]["parked_mean"] > 0 and r["actual"]["parked_mean"] > 0, r  # by parking sessions
