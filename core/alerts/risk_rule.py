"""The ``collapse-risk`` rule: the collapse-risk score of `core.risk` crossed its warning threshold.

``collapse-risk`` (warning; sidecars, and engines no sidecar fronts)
    The score of `core.risk.assess` over the key's history: sidecar inputs on a sidecar's key, engine
    inputs on a bare engine's (``bare_engine``). The condition holds while the score is at least
    ``risk_enter``; the exit condition (hysteresis) is a score below ``risk_exit``. It fires after
    ``risk_for_s`` of the condition and resolves after ``risk_clear_s`` of the exit condition. No data
    for any input: not judged. The alert's values are the score and the leading inputs' values; its
    summary names them (what to check: docs/runbook.md#collapse-risk). Defaults come from
    `core.risk.RiskSettings` (``warn_*``); ``risk_prefill_capacity_tokens_per_s`` sets the model's
    prefill capacity (the engine's uncached prefill rate; the model's other parameters are its defaults).

Each judgement's `core.risk.Assessment` is kept in the rule's scratch (``"assessment"``) so the
collectors can store the score and every input's contribution as signals (`AlertEvaluator.risk_of`).
"""

from __future__ import annotations

from dataclasses import replace

from core import risk

from .conditions import RuleContext
from .tracking import Condition

MODEL = risk.RiskSettings()


def collapse_risk_condition(ctx: RuleContext) -> Condition:
    history = ctx.history
    if history is None:
        return Condition(None)
    mode: risk.Mode = "engine" if ctx.bare_engine else "sidecar"
    s = ctx.settings
    model = MODEL
    if s.risk_prefill_capacity_tokens_per_s != MODEL.prefill_capacity_tokens_per_s:
        model = replace(MODEL, prefill_capacity_tokens_per_s=s.risk_prefill_capacity_tokens_per_s)
    assessment = risk.assess(history.points, ctx.now, mode, model)
    ctx.scratch["assessment"] = assessment
    if assessment.score is None:
        return Condition(None)
    values: dict[str, float | None] = {"score": assessment.score}
    values.update({i.name: i.value for i in assessment.leading(3)})
    summary = (
        f"{assessment.summary()}. Collapse is likely within minutes unless demand comes down: park "
        "sessions, lower the high band or switch the sidecar to budgeter-park (docs/runbook.md#collapse-risk)."
    )
    return Condition(
        assessment.score >= s.risk_enter, values, summary, exit_met=assessment.score < s.risk_exit
    )
