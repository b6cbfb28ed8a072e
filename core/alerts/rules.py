"""The alert rules as data: name, severity, where it applies, its hold times, the dashboard pages where
its fix is applied, and which rules it inhibits.

Everything that lists rules reads this module: the evaluator (`core.alerts.evaluator`), the Prometheus
export (`collectors.prom_rules`, and its Alertmanager ``inhibit_rules``), the runbook test
(`docs/runbook.md` has one section per rule, anchored by the rule's name) and the pages.

Adding a rule: a `RuleSpec` in `RULE_SPECS`, its condition in `core.alerts.conditions` (registered in
`core.alerts.evaluator.CONDITIONS`), its settings in `AlertSettings`, a runbook section, and an entry
in `collectors.prom_rules` (an exported rule, or the reason PromQL cannot express it).

**Inhibition** (the Alertmanager model): while a *cause* fires on a target, its *symptoms* on the
same target neither fire nor notify; a symptom already firing is closed ("inhibited by <cause>") and
fires again if its condition still holds once the cause resolves. "Same target" is the same target
URL; a cause on the whole target (engine label "") covers every engine label of that target, a cause on
one engine label covers that label and the target-wide rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["critical", "warning"]
Scope = Literal["target", "sidecar", "engine"]

# Dashboard pages (their url_path, see app.py) an alert can send the operator to.
PAGES = ("overview", "engine", "sessions", "budgeter", "compaction", "alerts", "audit")


@dataclass(frozen=True)
class RuleSpec:
    """One alert rule's identity and wiring (its condition lives in `core.alerts.conditions`).

    ``scopes``: ``"target"`` (every scraped target, keyed by the target), ``"sidecar"`` (sidecar
    targets) and/or ``"engine"`` (each engine label of an engine no sidecar fronts).
    ``for_setting`` / ``clear_setting`` name the `AlertSettings` fields holding the minimum duration
    before firing and before resolving (None: 0, the rule is an event or judges duration itself).
    ``fix_pages``: the dashboard pages where the fix is applied, first the main one.
    """

    name: str
    severity: Severity
    scopes: tuple[Scope, ...]
    for_setting: str | None
    clear_setting: str | None
    fix_pages: tuple[str, ...]
    meaning: str
    # AlertSettings field: judge the rule at most this often per key (a windowed rule changes slowly).
    eval_every_setting: str | None = None


RULE_SPECS: tuple[RuleSpec, ...] = (
    RuleSpec(
        "target-down",
        "critical",
        ("target",),
        "down_for_s",
        "up_for_s",
        ("engine",),
        "The target cannot be scraped: its last scrapes failed, so its numbers are not current.",
    ),
    RuleSpec(
        "stale-data",
        "warning",
        ("target",),
        None,
        None,
        ("engine",),
        "The target answers, but no fresh sample has been stored for a while: every page shows old numbers.",
    ),
    RuleSpec(
        "thin-reuse",
        "warning",
        ("sidecar",),
        "thin_reuse_for_s",
        "thin_reuse_clear_s",
        ("compaction",),
        "Thin reuse: most turns hit the cache (R_r) but few of their tokens do (R_t); compaction now "
        "would invalidate what little is shared.",
    ),
    RuleSpec(
        "demand-over-band",
        "warning",
        ("sidecar",),
        "demand_for_s",
        "demand_clear_s",
        ("budgeter",),
        "KV demand of admitted sessions is above the high band: the budgeter is not bringing it down.",
    ),
    RuleSpec(
        "compaction-in-thin-reuse",
        "critical",
        ("sidecar",),
        None,
        None,
        ("compaction",),
        "A compaction was granted while thin reuse held: it invalidates every cached block below the rewrite.",
    ),
    RuleSpec(
        "admission-wait",
        "warning",
        ("sidecar",),
        "admission_wait_for_s",
        "admission_wait_clear_s",
        ("budgeter", "sessions"),
        "Sessions are queueing at the sidecar for admission: the hit rate is protected by moving latency "
        "into a queue, and the oldest wait passed the limit.",
    ),
    RuleSpec(
        "collapse",
        "critical",
        ("sidecar", "engine"),
        "collapse_for_s",
        "collapse_clear_s",
        ("budgeter",),
        "Metastable collapse: the hit ratio fell, throughput fell and the backlog keeps growing.",
        eval_every_setting="collapse_eval_every_s",
    ),
    RuleSpec(
        "collapse-risk",
        "warning",
        ("sidecar", "engine"),
        "risk_for_s",
        "risk_clear_s",
        ("budgeter", "engine"),
        "Collapse risk: KV demand, misses and backlog are heading for the metastable collapse; acting now "
        "(park, lower the high band) is cheap, afterwards recovery takes minutes.",
    ),
)

# Cause -> symptoms it inhibits on the same target (see the module docstring).
INHIBITIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "target-down",
        (
            "stale-data",
            "thin-reuse",
            "demand-over-band",
            "compaction-in-thin-reuse",
            "admission-wait",
            "collapse",
            "collapse-risk",
        ),
    ),
    (
        "collapse",
        ("thin-reuse", "demand-over-band", "compaction-in-thin-reuse", "admission-wait", "collapse-risk"),
    ),
)

SPECS: dict[str, RuleSpec] = {spec.name: spec for spec in RULE_SPECS}
RULES: tuple[str, ...] = tuple(SPECS)
SEVERITY: dict[str, str] = {spec.name: spec.severity for spec in RULE_SPECS}


def causes_of(rule: str) -> tuple[str, ...]:
    """The rules that inhibit `rule` while they fire."""
    return tuple(cause for cause, symptoms in INHIBITIONS if rule in symptoms)


def inhibition_pairs() -> list[tuple[str, str]]:
    """Every (cause, symptom) pair, in declaration order."""
    return [(cause, symptom) for cause, symptoms in INHIBITIONS for symptom in symptoms]


def runbook_anchor(rule: str) -> str:
    """The runbook section of a rule: ``docs/runbook.md#<rule-name>``."""
    if rule not in SPECS:
        raise KeyError(f"unknown alert rule {rule!r}; known: {', '.join(RULES)}")
    return f"docs/runbook.md#{rule}"


def _check() -> None:
    if len(SPECS) != len(RULE_SPECS):
        raise ValueError("duplicate rule name in RULE_SPECS")
    for spec in RULE_SPECS:
        bad_pages = [p for p in spec.fix_pages if p not in PAGES]
        if not spec.fix_pages or bad_pages:
            raise ValueError(
                f"rule {spec.name}: fix_pages must name dashboard pages {PAGES}, got {spec.fix_pages}"
            )
    for cause, symptom in inhibition_pairs():
        if cause not in SPECS or symptom not in SPECS or cause == symptom:
            raise ValueError(f"inhibition {cause} -> {symptom}: both must be distinct known rules")
    for cause, symptom in inhibition_pairs():
        if cause in [s for c, s in inhibition_pairs() if c == symptom]:
            raise ValueError(f"inhibition cycle between {cause} and {symptom}")


_check()
