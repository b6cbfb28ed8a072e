"""The conditions of the simple rules, each a pure function of a `RuleContext` returning a `Condition`.

``target-down``: the last ``down_after_failures`` scrapes failed.
``stale-data``: the last attempt did not fail, yet the newest success is older than ``stale_after_s``.
``thin-reuse``: `core.reuse.regime_verdict` over the sidecar's window (D and its known turns): the very
judgement the sidecar's regime uses. Enter on ``"enter"``, resolve on ``"exit"``; not judged (None)
with too few known turns.
``demand-over-band``: demand / pool above the sidecar's high band; exit at or below band - margin.
``compaction-in-thin-reuse``: a grant during thin reuse within the last ``compaction_hold_s``.
``admission-wait``: the oldest wait for admission above ``admission_wait_s``; exit once it is at or below
``admission_wait_s * admission_wait_exit_fraction`` (nobody waiting counts as 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core import signals as sig
from core.reuse import regime_verdict

from .settings import AlertSettings
from .tracking import Condition, History, Key, TargetHealth


@dataclass
class RuleContext:
    """What a condition may look at: one (rule, key) at `now`."""

    key: Key
    now: float
    settings: AlertSettings
    health: TargetHealth
    history: History | None
    firing: bool
    bare_engine: bool = False
    # Rule-private state kept across evaluations of this (rule, key) (e.g. collapse's reference).
    scratch: dict[str, Any] = field(default_factory=dict)
    # Compaction grants during thin reuse: (latest grant ts, its summary, its values), if any.
    thin_grant: tuple[float, str, dict[str, float | None]] | None = None


def down_condition(ctx: RuleContext) -> Condition:
    health = ctx.health
    if health.last_attempt_ts is None:
        return Condition(None)
    s = ctx.settings
    failing = health.consecutive_failures >= s.down_after_failures and health.failing_since is not None
    values: dict[str, float | None] = {
        "consecutive_failures": float(health.consecutive_failures),
        "last_success_ts": health.last_success_ts,
    }
    if not failing:
        return Condition(False, values)
    since = health.failing_since or ctx.now
    return Condition(
        True,
        values,
        f"target down for {ctx.now - since:.0f} s ({health.consecutive_failures} failed scrapes): "
        f"{health.last_error or 'unknown error'}. Check the process and the URL.",
    )


def stale_condition(ctx: RuleContext) -> Condition:
    health = ctx.health
    if health.last_success_ts is None:
        return Condition(None)
    age = ctx.now - health.last_success_ts
    values: dict[str, float | None] = {"age_s": round(age, 1), "last_success_ts": health.last_success_ts}
    if health.last_attempt_ok is False:
        return Condition(False, values)  # failing: that is target-down's business
    if age > ctx.settings.stale_after_s:
        return Condition(
            True,
            values,
            f"no fresh data for {age:.0f} s although the target did not fail: "
            "scrapes are not happening (hung connection, stuck or overloaded collector).",
        )
    return Condition(False, values)


def thin_condition(ctx: RuleContext) -> Condition:
    history = ctx.history
    if history is None:
        return Condition(None)
    d = history.latest(sig.DIVERGENCE)
    known = history.latest(sig.KNOWN_TURNS)
    if d is None or known is None:
        return Condition(None)
    s = ctx.settings
    verdict = regime_verdict(d, int(known), s.regime)
    rt = history.latest(sig.TOKEN_WEIGHTED)
    rr = history.latest(sig.REQUEST_WEIGHTED)
    values = {"divergence": round(d, 4), "known_turns": known, "token_weighted": rt, "request_weighted": rr}
    if verdict is None:
        return Condition(None, values)
    summary = (
        f"thin reuse: D = R_r - R_t = {d:.2f} (>= {s.thin_reuse_enter} over {known:.0f} known turns); "
        f"R_r {'?' if rr is None else f'{rr:.2f}'} looks healthy but R_t "
        f"{'?' if rt is None else f'{rt:.2f}'} is low. Defer compaction; check for a storm of "
        "short low-overlap requests."
    )
    return Condition(verdict == "enter", values, summary, exit_met=verdict == "exit")


def demand_condition(ctx: RuleContext) -> Condition:
    history = ctx.history
    fraction = None if history is None else history.latest(sig.DEMAND_FRACTION)
    if history is None or fraction is None:
        return Condition(None)
    high = history.latest(sig.BAND_HIGH)
    high = ctx.settings.demand_band_high if high is None else high
    values = {
        "demand_fraction": round(fraction, 4),
        "band_high": high,
        "demand_tokens": history.latest(sig.DEMAND_TOKENS),
        "pool_tokens": history.latest(sig.POOL_TOKENS),
    }
    summary = (
        f"demand {fraction:.0%} of the KV pool, above the high band {high:.0%}: sessions' prefixes "
        "will evict each other. Check the budgeter is on (budgeter-park) and not everything is pinned."
    )
    return Condition(
        fraction > high, values, summary, exit_met=fraction <= high - ctx.settings.demand_exit_margin
    )


def oldest_wait(history: History) -> float | None:
    """The oldest admission wait the newest sidecar sample reports: its ``oldest_waiting_s``, or 0 when it
    reports nobody waiting; None when the sidecar reports neither (an older sidecar)."""
    newest = history.newest()
    if sig.OLDEST_WAITING_S in newest:
        return newest[sig.OLDEST_WAITING_S]
    if newest.get(sig.WAITING) == 0:
        return 0.0
    return None


def admission_wait_condition(ctx: RuleContext) -> Condition:
    history = ctx.history
    wait = None if history is None else oldest_wait(history)
    if history is None or wait is None:
        return Condition(None)
    s = ctx.settings
    waiting = history.latest(sig.WAITING)
    values = {"oldest_waiting_s": round(wait, 1), "waiting": waiting, "limit_s": s.admission_wait_s}
    summary = (
        f"admission wait: the oldest of {'?' if waiting is None else f'{waiting:.0f}'} waiting sessions "
        f"has waited {wait:.0f} s for admission (limit {s.admission_wait_s:.0f} s). The hit rate is "
        "held by queueing users: check demand against the pool on the Budgeter page, raise the "
        "pool or the high band, or end idle sessions on the Sessions page."
    )
    return Condition(wait > s.admission_wait_s, values, summary, exit_met=wait <= s.admission_wait_exit_s)


def compaction_condition(ctx: RuleContext) -> Condition:
    if ctx.thin_grant is None:
        return Condition(None)
    last, summary, values = ctx.thin_grant
    return Condition(ctx.now - last < ctx.settings.compaction_hold_s, values, summary)
