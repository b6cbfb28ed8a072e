"""The forecast's validation (issue 16 item 3) in the suite: three seeds at once, a shortened schedule.

The protocol (docs/dashboard.md, "Validation") runs the live collapse demo (x10) under `off` for 10 wall
minutes, previews `budgeter-park` through the Budgeter page's code, applies it for real through the
sidecar's authenticated control API and compares after 5 wall minutes, on 3 seeds. The suite runs the
same harness at the demo's x10 on 3 seeds at once, 6 wall minutes under `off` and 1.5 after the switch
(about 8 wall minutes): the engine long collapsed, with 145-160 sessions in the system at the switch.
On every seed: the engine collapsed under `off` and the preview of `off` says so, the preview of
`budgeter-park` foresees the recovery, the real switch recovered, and the preview is within the
issue's tolerance of what happened, R_t and parked sessions both.

Why this schedule (docs/dashboard.md has the runs): the simulated engine's per-block bookkeeping for
25k-token contexts makes it CPU-bound once the switch lets sessions cycle fast, three engines on two
cores, so the real turns/s after the switch fall 1.5-1.9x short of the preview (whose cost model is the
engine's own: `--truth`). At x20, or with fewer sessions at the switch (2-3 wall minutes under
`off`), the backlog drains within the comparison and that shortfall puts the parked count out of
tolerance; with ~150 sessions at the switch the parked backlog is still there 1.5 minutes later, as in
the protocol. The tolerance function itself is tested on exact values.
"""

from __future__ import annotations

import argparse

import pytest

from simulator import forecast_validate
from tests.support import free_port

SEEDS = [1, 2, 3]
WARM_MIN = 6.0  # wall minutes under `off` (the protocol: 10): 60 simulated minutes, the engine long collapsed
AFTER_MIN = 1.5  # wall minutes after the switch, and the preview's length (the protocol: 5)
SPEED = 10.0  # the collapse demo's time scale


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


def test_the_latency_outside_the_engine_is_the_difference_of_exact_means() -> None:
    turns = [
        {"outcome": "ok", "latency_s": 1.0},
        {"outcome": "ok", "latency_s": 2.0},
        {"outcome": "held_499", "latency_s": None},
        {"outcome": "error", "latency_s": 9.0},
    ]
    # the engine finished 4 requests taking 4.0 s in all between the two reads: mean 1.0; the turns' 1.5
    assert forecast_validate.latency_outside(turns, (10.0, 6.0), (14.0, 10.0)) == 0.5
    assert forecast_validate.latency_outside(turns, (10.0, 6.0), (10.0, 6.0)) is None  # nothing finished
    assert forecast_validate.latency_outside(turns, None, (14.0, 10.0)) is None  # a read failed
    assert forecast_validate.latency_outside([], (10.0, 6.0), (14.0, 10.0)) is None


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.xdist_group("heavy")
@pytest.mark.timeout(900)
def test_the_budgeter_park_preview_foresees_the_switched_demos_recovery_within_the_tolerance(
    tmp_path,
) -> None:
    args = argparse.Namespace(
        seeds=SEEDS,
        warm=WARM_MIN,
        after=AFTER_MIN,
        speed=SPEED,
        fit=None,
        fit_engine=False,
        parallel=True,
        truth=False,
        data_dir=tmp_path,
    )
    results = forecast_validate.run(args, [(free_port(), free_port()) for _ in SEEDS])
    for r in results:
        print(
            f"seed {r['seed']}: preview {r['preview']}, actual {r['actual']}, within {r['within']}, turn overhead {r['turn_overhead_s']}, outside {r['latency_outside_s']}"
        )
    assert [r["seed"] for r in results] == SEEDS
    for r in results:
        assert r["cost_source"] == "latencies", r  # no fit file: the estimate from the recorded signals
        assert r["preview_off"]["r_t"] < 0.5, r  # the engine had collapsed, and the preview of `off` says so
        assert r["actual"]["r_t"] > 0.5, r  # budgeter-park, applied for real, brought it back
        assert r["preview"]["r_t"] > r["preview_off"]["r_t"] + 0.3, r  # and the preview foresaw it
        assert r["within"] == {"r_t": True, "parked": True}, r  # the issue's tolerance, on every seed
