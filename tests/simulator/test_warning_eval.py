"""simulator.warning_eval: the run plan, the onset, the figures' definitions, and one replayed run end to end."""

from __future__ import annotations

from simulator import warning_eval as we


def test_the_plan_is_seeded_and_straddles_the_tipping_point():
    assert we.run_plan(1, 7) == we.run_plan(1, 7)
    scenarios = [we.run_plan(i, 100 + i)[0] for i in range(6)]
    assert scenarios == ["agent-steady", "agent-burst", "agent-flush"] * 2
    bursts = [round(float(we.run_plan(1, s)[1]["burst_rate"]) * 300) for s in range(200)]
    assert min(bursts) == 10 and max(bursts) == 30
    # neither a tuning base nor a reported base (docs/collapse-risk.md names them)
    tuning = (100, 200, 300, 500, 600, 700, 800)
    reported = (1000, 2000, 3000, 4000, *range(13_000, 25_000, 1000))
    assert we.DEFAULT_SEED_BASE not in (*tuning, *reported)


def test_onset_is_the_last_fall_below_0_3_before_the_first_degraded_minute():
    # hit rate 0.9 for 100 s, 0.1 for 40 s (a dip), 0.9 until 300 s, then 0.1: two falls before minute 8
    prompt = [1000.0] * 600
    cached = [100.0 if 100 <= t < 140 or t >= 300 else 900.0 for t in range(600)]
    # trailing-30-s rate: below 0.3 once >= 23 of its 30 s are at 0.1, i.e. at t = 122 (s 123) and t = 322
    assert we.onset_s(prompt, cached, 8) == 323
    assert we.onset_s(prompt, cached, 5) == 123  # only the first fall lies before minute 5
    assert we.onset_s([0.0] * 300, [0.0] * 300, 5) is None


def run(onset, sidecar, follow_up=None):
    return {
        "seed": 0,
        "onset_s": onset,
        "onset_in_follow_up_s": follow_up,
        "sidecar": {"collapse-risk": sidecar, "collapse": []},
        "engine": {"collapse-risk": [], "collapse": []},
    }


def test_figures_follow_the_issue_definitions():
    results = [
        run(1000.0, [900.0]),  # warned 100 s ahead
        run(1000.0, [950.0]),  # 50 s: too late
        run(1000.0, [300.0, 990.0]),  # first warning 700 s ahead: warned, and a false alarm
        run(None, [500.0]),  # never degrades: false alarm
        run(None, [2600.0], 3000.0),  # followed by an onset in the follow-up: not a false alarm
        run(None, []),
    ]
    f = we.summarize(results, "sidecar")
    assert (f["runs"], f["degraded_runs"], f["non_degraded_runs"]) == (6, 3, 3)
    assert f["warned_before_degraded"] == 2 and f["false_alarm_runs"] == 2
    assert (f["lead_s_min"], f["lead_s_median"]) == (50.0, 100.0)


def test_replayed_runs_warn_before_a_collapse_and_stay_quiet_without_one():
    # seed 6's plan: a 29-session burst that collapses; the collapse alert fires only minutes after the onset
    r = we.judge(1, 6, 20.0)
    assert r["scenario"] == "agent-burst" and r["onset_s"] is not None
    onset = r["onset_s"]
    assert onset - r["sidecar"]["collapse-risk"][0] >= we.LEAD_S["sidecar"]
    assert onset - r["engine"]["collapse-risk"][0] >= we.LEAD_S["engine"]
    assert r["sidecar"]["collapse"][0] > onset and r["engine"]["collapse"][0] > onset
    # seed 4's plan: an 11-session burst the engine absorbs
    quiet = we.judge(1, 4, 20.0)
    assert quiet["onset_s"] is None and quiet["onset_in_follow_up_s"] is None
    assert quiet["sidecar"]["collapse-risk"] == [] and quiet["engine"]["collapse-risk"] == []
