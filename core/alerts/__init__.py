"""Alert rules over canonical signals, with hysteresis and a minimum duration. Pure: the clock is passed in.

The collectors feed every scrape's signals into an `AlertEvaluator` (one per process) and
persist the `Transition`s it returns; the offline tests replay recorded simulator runs through
the very same object.

Vocabulary: a *key* is ``(target URL, engine label)``; a *rule* looks at the recent history of
that key's signals and says whether its condition holds (``True``), does not hold
(``False``) or cannot be judged (``None``: no data, which never fires and never resolves).
Each (rule, key) has a `RuleTracker`: the condition must hold continuously for the rule's
``for_s`` before the alert fires, and its *exit* condition (stricter than "not entered":
that is the hysteresis) must hold for ``clear_s`` before it resolves. One sample never
flips an alert either way.

Rules (defaults in `AlertSettings`):

``target-down`` (critical)
    The last ``down_after_failures`` (3) scrapes of the target failed, and that has held for
    ``down_for_s`` (5 s). Resolves after ``up_for_s`` (5 s) of successful scrapes.
``stale-data`` (warning)
    The target's last scrape attempt did *not* fail, yet its newest successful scrape is older
    than ``stale_after_s``: scrapes are not happening (a hung connection, a stuck or overloaded
    collector), so every page shows old numbers. A failing target is ``target-down`` instead.
``thin-reuse`` (warning, sidecars)
    The sidecar's regime judgement, `core.reuse.regime_verdict` (one function for both): divergence
    ``D = R_r - R_t`` >= ``thin_reuse_enter`` (0.5) with at least ``thin_reuse_min_turns`` (20) known
    turns in the sidecar's window, for ``thin_reuse_for_s``; resolves once ``D`` < ``thin_reuse_exit``
    (0.4), judged with as many turns, for ``thin_reuse_clear_s``. Defaults come from
    `core.reuse.RegimeConfig`.
``demand-over-band`` (warning, sidecars)
    demand / pool above the high band (the sidecar's ``band_high``; default `core.budgeter.BudgeterConfig.high`, 0.95) for
    ``demand_for_s``: the budgeter is not bringing demand down (control off, or everything
    pinned). Resolves once demand / pool <= high band - ``demand_exit_margin`` for ``demand_clear_s``.
``admission-wait`` (warning, sidecars)
    The oldest session waiting at the sidecar for admission (``oldest_waiting_s``; nobody waiting is 0)
    has waited more than ``admission_wait_s`` (60 s) for ``admission_wait_for_s`` (15 s); resolves once
    it is at most ``admission_wait_s * admission_wait_exit_fraction`` (30 s) for ``admission_wait_clear_s``.
``compaction-in-thin-reuse`` (critical, sidecars)
    A compaction was *granted* while thin-reuse held (the decision's own divergence, else the
    sidecar's latest ``D``, >= ``thin_reuse_enter``). Event rule: fires at once, resolves
    ``compaction_hold_s`` after the last such grant.
``collapse`` (critical; sidecars, and engines no sidecar fronts)
    Metastable collapse over a 5-minute window: hit ratio low, throughput down against its recent
    healthy level, backlog growing. Full definition in `core.alerts.collapse`.
``collapse-risk`` (warning; sidecars, and engines no sidecar fronts)
    The collapse-risk score of `core.risk` (KV demand and its trend, backlog growth, missed prefill, hit-rate
    trend; engine-only inputs on a bare engine) at least ``risk_enter`` for ``risk_for_s``; resolves below
    ``risk_exit`` for ``risk_clear_s``. Minutes before ``collapse``, which inhibits it. See
    `core.alerts.risk_rule`.

Each rule's severity, scopes, hold times, the dashboard pages where its fix is applied, and the
cause -> symptom inhibitions are data in `core.alerts.rules`; inhibition is applied by
`core.alerts.evaluator`. Every rule has a runbook section, ``docs/runbook.md#<rule-name>``.

Modules: `settings` (AlertSettings), `rules` (the rules as data), `tracking` (Condition, RuleTracker,
History, Transition), `conditions`, `collapse` and `risk_rule` (the conditions), `evaluator` (AlertEvaluator, replay).
"""

from __future__ import annotations

from .collapse import CollapseReference, collapse_condition
from .conditions import RuleContext
from .evaluator import CONDITIONS, AlertEvaluator, replay
from .rules import (
    INHIBITIONS,
    PAGES,
    RULE_SPECS,
    RULES,
    SEVERITY,
    SPECS,
    RuleSpec,
    causes_of,
    inhibition_pairs,
    runbook_anchor,
)
from .settings import AlertSettings
from .tracking import RULE_SIGNALS, Condition, History, Key, RuleTracker, TargetHealth, Transition

__all__ = [
    "CONDITIONS",
    "INHIBITIONS",
    "PAGES",
    "RULES",
    "RULE_SIGNALS",
    "RULE_SPECS",
    "SEVERITY",
    "SPECS",
    "AlertEvaluator",
    "AlertSettings",
    "CollapseReference",
    "Condition",
    "History",
    "Key",
    "RuleContext",
    "RuleSpec",
    "RuleTracker",
    "TargetHealth",
    "Transition",
    "causes_of",
    "collapse_condition",
    "inhibition_pairs",
    "replay",
    "runbook_anchor",
]
