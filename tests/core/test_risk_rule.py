"""core.alerts.risk_rule: the collapse-risk alert fires, holds with hysteresis, resolves, is inhibited by collapse,
and exposes each judgement's assessment (what the collectors store)."""

from __future__ import annotations

import pytest

from core import signals as sig
from core.alerts import SEVERITY, SPECS, AlertEvaluator, AlertSettings, causes_of, replay
from core.risk import RiskSettings, assess

URL = "http://sidecar:8100"


def sidecar_run(demand_at, seconds: int) -> list[tuple[float, dict[str, float]]]:
    """Per-second sidecar signals with a demand fraction given by ``demand_at(t)``; nothing else under pressure."""
    return [
        (
            float(t),
            {
                sig.DEMAND_FRACTION: demand_at(t),
                sig.SESSIONS_IN_SYSTEM: 10.0,
                sig.TOKEN_WEIGHTED: 0.9,
                sig.TURNS_PER_S: 1.0,
                sig.DEMAND_TOKENS: 300_000.0,
                sig.ADMITTED: 10.0,
            },
        )
        for t in range(1, seconds + 1)
    ]


def test_the_rule_is_a_warning_with_its_defaults_from_core_risk():
    s, r = AlertSettings(), RiskSettings()
    assert SEVERITY["collapse-risk"] == "warning" and SPECS["collapse-risk"].scopes == ("sidecar", "engine")
    assert (s.risk_enter, s.risk_exit, s.risk_for_s, s.risk_clear_s) == (
        r.warn_enter,
        r.warn_exit,
        r.warn_for_s,
        r.warn_clear_s,
    )
    assert "collapse" in causes_of("collapse-risk")
    with pytest.raises(ValueError, match="risk_exit must be below risk_enter"):
        AlertSettings(risk_enter=0.4, risk_exit=0.5)


def test_fires_after_for_s_and_resolves_after_clear_s_below_exit():
    # demand jumps to 1.5 of the pool at t=101 (demand_projection, extrapolating the jump, and kv_demand rise)
    # and back to 0.5 at t=201
    points = sidecar_run(lambda t: 1.5 if 100 < t <= 200 else 0.5, 400)
    settings = AlertSettings(risk_for_s=5, risk_clear_s=60)
    risk = [x for x in replay(points, url=URL, settings=settings) if x.rule == "collapse-risk"]
    assert [x.event for x in risk] == ["firing", "resolved"]
    # first judgement at or above enter (the model's numbers are tested exactly in test_risk.py), then for_s
    scores = [(t, assess(points[: int(t)], t, "sidecar").score) for t, _ in points]
    entered = next(t for t, score in scores if score >= settings.risk_enter)
    assert 100 < entered < 130
    assert risk[0].ts == entered + 5
    assert risk[0].values["score"] >= 0.6 and risk[0].values["demand_projection"] is not None
    assert "leading: demand_projection" in risk[0].summary
    assert "budgeter-park" in risk[0].summary
    # resolves clear_s after the score stays below exit
    below = next(t for t, score in scores if t > risk[0].ts and score < settings.risk_exit)
    assert all(score < settings.risk_exit for t, score in scores if t >= below)
    assert risk[1].ts == below + 60


def test_one_dip_below_exit_does_not_resolve_and_one_spike_does_not_fire():
    spike = sidecar_run(lambda t: 3.0 if t == 100 else 0.5, 300)  # one sample: 30-s mean 0.58
    assert [x for x in replay(spike, url=URL) if x.rule == "collapse-risk"] == []
    # high demand with a 20-s dip to 0.5: the score falls below exit for under clear_s, so it stays firing
    dip = sidecar_run(lambda t: 0.5 if t <= 50 or 150 < t <= 170 else 1.5, 260)
    assert [x.event for x in replay(dip, url=URL) if x.rule == "collapse-risk"] == ["firing"]


def test_no_data_never_fires():
    points = [(float(t), {sig.TOKEN_WEIGHTED: 0.1}) for t in range(1, 200)]
    assert [x for x in replay(points, url=URL) if x.rule == "collapse-risk"] == []


def test_bare_engine_uses_engine_inputs_and_risk_of_exposes_the_assessment():
    ev = AlertEvaluator()
    fired = []
    for t in range(1, 121):
        values = {
            sig.KV_USAGE: 0.99,
            sig.REQUESTS_WAITING: 25.0,
            sig.PREEMPTIONS_PER_S: 0.0,
            sig.PROMPT_TOKENS_PER_S: 3000.0,
            sig.CACHED_TOKENS_PER_S: 2700.0,
        }
        ev.observe_scrape("http://engine", float(t), True)
        ev.observe(("http://engine", "0"), float(t), values)
        fired += [
            x
            for x in ev.evaluate_target("http://engine", float(t), role="engine", engine_labels=("0",))
            if x.rule == "collapse-risk"
        ]
    # kv_usage 0.99 (+0.55) and 25 waiting (+0.3): 0.85 from the first judgement, fires 5 s later
    assert [(x.event, x.ts, x.key) for x in fired] == [("firing", 6.0, ("http://engine", "0"))]
    risk = ev.risk_of("http://engine", since=120.0)
    a = risk[("http://engine", "0")]
    assert a.mode == "engine" and a.score == pytest.approx(0.85)
    assert [i.name for i in a.leading()] == ["kv_usage", "queue"]
    assert a.signals()[sig.COLLAPSE_RISK] == pytest.approx(0.85) and a.signals()["risk_kv_usage"] == 0.55
    assert ev.risk_of("http://engine", since=121.0) == {}
    # an engine fronted by a sidecar leaves the judgement to the sidecar
    ev2 = AlertEvaluator()
    ev2.observe(("http://engine", "0"), 1.0, {sig.KV_USAGE: 1.0})
    ev2.evaluate_target("http://engine", 1.0, role="engine", engine_labels=("0",), fronted_by_sidecar=True)
    assert ev2.risk_of("http://engine") == {}


def test_collapse_inhibits_collapse_risk():
    ev = AlertEvaluator()
    key = (URL, "")
    ev.restore_firing("collapse", key)
    out = []
    for t, values in sidecar_run(lambda t: 2.0, 60):
        ev.observe_scrape(URL, t, True)
        ev.observe(key, t, values)
        out += [x for x in ev.evaluate_target(URL, t, role="sidecar") if x.rule == "collapse-risk"]
    assert out == []  # held by its tracker, not published while collapse fires
    assert ev.trackers[("collapse-risk", key)].firing


def test_the_prefill_capacity_is_a_setting_of_the_fleet():
    # a bare engine missing 6000 prompt tokens/s: 0.6 of the default 10000 tokens/s, 1.5x a 4000 tokens/s engine's
    def run(settings):
        ev = AlertEvaluator(settings)
        for t in range(1, 40):
            ev.observe(
                ("http://e", "0"),
                float(t),
                {sig.PROMPT_TOKENS_PER_S: 8000.0, sig.CACHED_TOKENS_PER_S: 2000.0, sig.KV_USAGE: 0.8},
            )
            ev.evaluate_target("http://e", float(t), role="engine", engine_labels=("0",))
        return ev.risk_of("http://e")[("http://e", "0")]

    default = run(AlertSettings())
    small = run(AlertSettings(risk_prefill_capacity_tokens_per_s=4000))
    x = {i.name: i for i in default.inputs}
    y = {i.name: i for i in small.inputs}
    assert x["missed_prefill"].value == pytest.approx(0.6) and y["missed_prefill"].value == pytest.approx(1.5)
    with pytest.raises(ValueError, match="risk_prefill_capacity_tokens_per_s must be positive, got 0"):
        AlertSettings(risk_prefill_capacity_tokens_per_s=0)
