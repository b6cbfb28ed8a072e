"""core.alerts rules as data, the shared thin-reuse judgement, admission-wait and inhibition."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from core import signals as sig
from core.alerts import (
    CONDITIONS,
    INHIBITIONS,
    RULE_SPECS,
    RULES,
    SPECS,
    AlertEvaluator,
    AlertSettings,
    causes_of,
    inhibition_pairs,
    replay,
    runbook_anchor,
)
from core.budgeter import BudgeterConfig
from core.reuse import RegimeConfig

URL = "http://sidecar:8100"
KEY = (URL, "")


def test_every_rule_has_a_condition_durations_and_a_fix_page():
    assert set(CONDITIONS) == set(RULES)
    names = {f.name for f in dataclasses.fields(AlertSettings)}
    for spec in RULE_SPECS:
        for setting in (spec.for_setting, spec.clear_setting, spec.eval_every_setting):
            assert setting is None or setting in names, (spec.name, setting)
        assert spec.fix_pages and spec.meaning
    assert SPECS["collapse"].fix_pages == ("budgeter",)
    assert SPECS["thin-reuse"].fix_pages == ("compaction",)
    assert SPECS["admission-wait"].fix_pages == ("budgeter", "sessions")
    assert runbook_anchor("admission-wait") == "docs/runbook.md#admission-wait"
    with pytest.raises(KeyError, match="unknown alert rule 'nope'"):
        runbook_anchor("nope")


def test_policy_defaults_come_from_the_core_configs():
    s, regime, budget = AlertSettings(), RegimeConfig(), BudgeterConfig()
    assert (s.thin_reuse_enter, s.thin_reuse_exit, s.thin_reuse_min_turns) == (0.5, 0.4, 20)
    assert (s.thin_reuse_enter, s.thin_reuse_exit, s.thin_reuse_min_turns) == (
        regime.enter,
        regime.exit,
        regime.min_turns,
    )
    assert s.demand_band_high == budget.high == 0.95
    assert s.regime == regime
    assert s.admission_wait_s == 60.0 and s.admission_wait_exit_s == 30.0


def test_settings_reject_bad_admission_wait_and_min_turns():
    with pytest.raises(ValueError, match="admission_wait_exit_fraction must be in"):
        AlertSettings(admission_wait_exit_fraction=1.0)
    with pytest.raises(ValueError, match="admission_wait_s must be positive, got 0"):
        AlertSettings(admission_wait_s=0)
    with pytest.raises(ValueError, match="thin_reuse_min_turns must be a whole number >= 1, got 0"):
        AlertSettings(thin_reuse_min_turns=0)


def _thin(d, known, n=60):
    return [
        (
            float(t),
            {
                sig.DIVERGENCE: d,
                sig.KNOWN_TURNS: known,
                sig.TOKEN_WEIGHTED: 0.3,
                sig.REQUEST_WEIGHTED: 0.3 + d,
            },
        )
        for t in range(n)
    ]


@pytest.mark.parametrize(
    ("d", "known", "fires"),
    [
        (0.5, 20, True),  # exactly the enter threshold, exactly the minimum: fires (D >= 0.5)
        (0.4999, 20, False),
        (0.9, 19, False),  # too few known turns: not judged, like the regime
    ],
)
def test_thin_reuse_alert_uses_the_regime_judgement(d, known, fires):
    events = [(x.event, x.ts) for x in replay(_thin(d, known)) if x.rule == "thin-reuse"]
    assert events == ([("firing", 30.0)] if fires else [])


def test_thin_reuse_holds_between_the_thresholds_and_not_when_unjudged():
    points = _thin(0.6, 50, 40)
    points += [(40.0 + t, {sig.DIVERGENCE: 0.4, sig.KNOWN_TURNS: 50}) for t in range(40)]  # hold (not < 0.4)
    points += [(80.0 + t, {sig.DIVERGENCE: 0.1, sig.KNOWN_TURNS: 5}) for t in range(40)]  # unjudged
    points += [(120.0 + t, {sig.DIVERGENCE: 0.39, sig.KNOWN_TURNS: 20}) for t in range(40)]  # exit
    events = [(x.event, x.ts) for x in replay(points) if x.rule == "thin-reuse"]
    assert events == [("firing", 30.0), ("resolved", 150.0)]


def _waits(values, start=0.0):
    return [(start + t, v) for t, v in enumerate(values)]


def test_admission_wait_fires_over_the_limit_and_resolves_with_hysteresis():
    settings = AlertSettings(admission_wait_s=60, admission_wait_for_s=10, admission_wait_clear_s=5)
    ev = AlertEvaluator(settings)
    timeline = (
        [{sig.WAITING: 0}] * 5
        + [{sig.WAITING: 3, sig.OLDEST_WAITING_S: 61.0 + t} for t in range(30)]
        + [{sig.WAITING: 2, sig.OLDEST_WAITING_S: 45.0}] * 20  # under the limit, over the exit: holds
        + [{sig.WAITING: 0}] * 10
    )  # nobody waits (null in /state): 0
    events = []
    for t, values in enumerate(timeline):
        ev.observe_scrape(URL, float(t), True)
        ev.observe(KEY, float(t), values)
        events += [
            (x.event, x.ts, x.values.get("oldest_waiting_s"))
            for x in ev.evaluate_target(URL, float(t), role="sidecar")
            if x.rule == "admission-wait"
        ]
    assert events[0] == ("firing", 15.0, 71.0)
    assert events[1][:2] == ("resolved", 60.0)
    assert len(events) == 2
    summary = ev.last_summary[("admission-wait", KEY)][0]
    assert "limit 60 s" in summary and "Budgeter" in summary and "Sessions" in summary


def test_admission_wait_unknown_without_the_signal():
    ev = AlertEvaluator(AlertSettings(admission_wait_for_s=0))
    for t in range(100):
        ev.observe_scrape(URL, float(t), True)
        ev.observe(KEY, float(t), {sig.WAITING: 4})  # an older sidecar: no oldest_waiting_s
        assert [
            x for x in ev.evaluate_target(URL, float(t), role="sidecar") if x.rule == "admission-wait"
        ] == []


def test_inhibition_data_is_consistent():
    assert ("collapse", "thin-reuse") in inhibition_pairs()
    assert ("collapse", "demand-over-band") in inhibition_pairs()
    assert ("target-down", "stale-data") in inhibition_pairs()
    assert "collapse" in causes_of("admission-wait") and causes_of("target-down") == ()
    for cause, symptoms in INHIBITIONS:
        assert cause in RULES and set(symptoms) <= set(RULES)


def _collapse_then_thin(ev: AlertEvaluator, *, collapse_firing_from: float | None):
    """thin-reuse holds from t=0; the collapse tracker is forced firing from `collapse_firing_from` to t=80."""
    out = []
    for t in range(0, 150):
        ts = float(t)
        ev.observe_scrape(URL, ts, True)
        ev.observe(
            KEY,
            ts,
            {sig.DIVERGENCE: 0.8, sig.KNOWN_TURNS: 100, sig.TOKEN_WEIGHTED: 0.1, sig.REQUEST_WEIGHTED: 0.9},
        )
        tracker = ev._tracker("collapse", KEY)
        tracker.firing = collapse_firing_from is not None and collapse_firing_from <= ts < 80
        out += [
            (x.rule, x.event, x.ts, x.inhibited_by)
            for x in ev.evaluate_target(URL, ts, role="sidecar")
            if x.rule != "collapse"
        ]
    return out


def test_a_cause_firing_keeps_its_symptom_from_firing_until_it_resolves():
    events = _collapse_then_thin(AlertEvaluator(AlertSettings(thin_reuse_for_s=30)), collapse_firing_from=0)
    # thin-reuse held since t=0 (raw firing at 30) but collapse fired: it fires only once collapse is gone.
    assert events == [("thin-reuse", "firing", 80.0, None)]


def test_a_firing_symptom_is_closed_as_inhibited_when_its_cause_fires():
    ev = AlertEvaluator(AlertSettings(thin_reuse_for_s=30))
    events = _collapse_then_thin(ev, collapse_firing_from=50)
    assert events == [
        ("thin-reuse", "firing", 30.0, None),
        ("thin-reuse", "resolved", 50.0, "collapse"),
        ("thin-reuse", "firing", 80.0, None),
    ]


def test_target_down_inhibits_a_bare_engines_collapse_on_every_label():
    ev = AlertEvaluator(AlertSettings(down_for_s=0, down_after_failures=1))
    ev.observe_scrape("http://e", 0.0, True)
    ev.restore_firing("collapse", ("http://e", "0"))
    ev.observe_scrape("http://e", 1.0, False, "connection refused")
    out = ev.evaluate_target("http://e", 1.0, role="engine", engine_labels=("0",))
    assert [(x.rule, x.key, x.event, x.inhibited_by) for x in out] == [
        ("target-down", ("http://e", ""), "firing", None),
        ("collapse", ("http://e", "0"), "resolved", "target-down"),
    ]
    assert out[1].summary.startswith("inhibited by target-down")


RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"
PARTS = ("**What it means.**", "**Confirm on the dashboard.**", "**What to do.**", "**How to undo.**")


def runbook_sections() -> dict[str, str]:
    """Level-2 sections of docs/runbook.md by their GitHub anchor."""
    sections: dict[str, str] = {}
    for chunk in re.split(r"^## ", RUNBOOK.read_text(), flags=re.M)[1:]:
        title, _, body = chunk.partition("\n")
        anchor = re.sub(r"[^a-z0-9 -]", "", title.strip().lower()).replace(" ", "-")
        sections[anchor] = body
    return sections


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_has_a_runbook_section_with_its_four_parts(rule):
    sections = runbook_sections()
    assert rule in sections, f"docs/runbook.md has no section '## {rule}' (anchor #{rule})"
    missing = [part for part in PARTS if part not in sections[rule]]
    assert not missing, f"docs/runbook.md#{rule} lacks {missing}"
