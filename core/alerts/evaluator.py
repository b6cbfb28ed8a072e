"""`AlertEvaluator`: every rule for every key, with inhibition; `replay` for recorded runs.

For each target the evaluator steps the rules that apply (`RuleSpec.scopes`) through their
`RuleTracker` (raw state), then *publishes*: a (rule, key) is published firing while its tracker fires
and no cause of it (`core.alerts.rules.INHIBITIONS`) fires on the same target. A `Transition` is
returned whenever the published state changes, so an inhibited symptom neither fires nor notifies, a
symptom firing when its cause starts is resolved with ``inhibited_by`` set, and it fires again if it
still holds when its cause resolves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from core import signals as sig
from core.risk import Assessment

from . import conditions as c
from .collapse import collapse_rule
from .risk_rule import collapse_risk_condition
from .rules import RULE_SPECS, SEVERITY, SPECS, causes_of
from .settings import AlertSettings
from .tracking import Condition, History, Key, RuleTracker, TargetHealth, Transition

RuleKey = tuple[str, Key]

# The condition of every rule in `RULE_SPECS` (a test checks they match).
CONDITIONS: dict[str, Callable[[c.RuleContext], Condition]] = {
    "target-down": c.down_condition,
    "stale-data": c.stale_condition,
    "thin-reuse": c.thin_condition,
    "demand-over-band": c.demand_condition,
    "compaction-in-thin-reuse": c.compaction_condition,
    "admission-wait": c.admission_wait_condition,
    "collapse": collapse_rule,
    "collapse-risk": collapse_risk_condition,
}


class AlertEvaluator:
    """All rules for all keys. Feed it with `observe` / `observe_compaction`, then `evaluate_target`."""

    def __init__(self, settings: AlertSettings | None = None) -> None:
        self.settings = settings or AlertSettings()
        self._keep = self._keep_s(self.settings)
        self.histories: dict[Key, History] = {}
        self.trackers: dict[RuleKey, RuleTracker] = {}
        self.scratch: dict[RuleKey, dict[str, object]] = {}
        self.health: dict[str, TargetHealth] = {}
        self.thin_grants: dict[Key, tuple[float, str, dict[str, float | None]]] = {}
        self.last_summary: dict[RuleKey, tuple[str, dict[str, float | None]]] = {}
        self.published: dict[str, set[RuleKey]] = {}
        self._evaluated_at: dict[RuleKey, float] = {}

    @staticmethod
    def _keep_s(settings: AlertSettings) -> float:
        return settings.collapse_window_s + 30.0

    # -- inputs -------------------------------------------------------------------------------

    def observe(self, key: Key, ts: float, values: Mapping[str, float | None]) -> None:
        history = self.histories.get(key)
        if history is None:
            history = self.histories[key] = History(self._keep)
        history.add(ts, values)

    def observe_scrape(self, url: str, ts: float, ok: bool, error: str | None = None) -> None:
        health = self.health.setdefault(url, TargetHealth())
        health.last_attempt_ts = ts
        health.last_attempt_ok = ok
        if ok:
            health.last_success_ts = ts
            health.consecutive_failures = 0
            health.failing_since = None
            health.last_error = None
        else:
            health.consecutive_failures += 1
            if health.failing_since is None:
                health.failing_since = ts
            health.last_error = error

    def observe_compaction(self, key: Key, ts: float, *, granted: bool, divergence: float | None) -> bool:
        """Record one gate decision; True when it was a grant during thin reuse."""
        if not granted:
            return False
        d = divergence
        if d is None and key in self.histories:
            d = self.histories[key].latest(sig.DIVERGENCE)
        enter = self.settings.thin_reuse_enter
        if d is None or d < enter:
            return False
        last = max(ts, self.thin_grants[key][0]) if key in self.thin_grants else ts
        self.thin_grants[key] = (
            last,
            f"compaction granted at D = {d:.2f} (thin reuse, >= {enter}): it invalidates every cached block "
            "below the rewrite; defer compaction while D is high",
            {"divergence": round(d, 4), "decision_ts": ts},
        )
        return True

    def update_settings(self, settings: AlertSettings) -> None:
        """New thresholds and durations (a config reload); alerts in progress keep their state."""
        self.settings = settings
        self._keep = self._keep_s(settings)
        for history in self.histories.values():
            history.keep_s = self._keep
        for (rule, _key), tracker in self.trackers.items():
            tracker.for_s, tracker.clear_s = self._durations(rule)

    def restore_firing(self, rule: str, key: Key) -> None:
        """Mark (rule, key) as already firing (an open alert found in the database at start-up)."""
        self._tracker(rule, key).firing = True
        self.published.setdefault(key[0], set()).add((rule, key))

    def forget_target(self, url: str) -> None:
        for key in [k for k in self.histories if k[0] == url]:
            del self.histories[key]
        self.health.pop(url, None)

    # -- evaluation ---------------------------------------------------------------------------

    def _durations(self, rule: str) -> tuple[float, float]:
        spec = SPECS[rule]
        s = self.settings
        for_s = float(getattr(s, spec.for_setting)) if spec.for_setting else 0.0
        clear_s = float(getattr(s, spec.clear_setting)) if spec.clear_setting else 0.0
        return for_s, clear_s

    def _tracker(self, rule: str, key: Key) -> RuleTracker:
        tracker = self.trackers.get((rule, key))
        if tracker is None:
            tracker = self.trackers[(rule, key)] = RuleTracker(*self._durations(rule))
        return tracker

    def _due(self, rule: str, key: Key, now: float) -> bool:
        """A windowed rule is judged at most every `eval_every_setting` seconds per key (and once per instant)."""
        setting = SPECS[rule].eval_every_setting
        if setting is None:
            return True
        last = self._evaluated_at.get((rule, key))
        if last is not None and now - last < float(getattr(self.settings, setting)):
            return False
        self._evaluated_at[(rule, key)] = now
        return True

    def _step(
        self,
        rule: str,
        key: Key,
        now: float,
        *,
        history: History | None,
        health: TargetHealth,
        bare_engine: bool = False,
    ) -> None:
        if not self._due(rule, key, now):
            return
        tracker = self._tracker(rule, key)
        ctx = c.RuleContext(
            key=key,
            now=now,
            settings=self.settings,
            health=health,
            history=history,
            firing=tracker.firing,
            bare_engine=bare_engine,
            scratch=self.scratch.setdefault((rule, key), {}),
            thin_grant=self.thin_grants.get(key),
        )
        condition = CONDITIONS[rule](ctx)
        if condition.active is not None and condition.summary:
            self.last_summary[(rule, key)] = (condition.summary, condition.values)
        tracker.update(now, condition)

    def evaluate_target(
        self,
        url: str,
        now: float,
        *,
        role: str,
        engine_labels: Iterable[str] = ("",),
        fronted_by_sidecar: bool = False,
    ) -> list[Transition]:
        """Run every rule that applies to one target; returns the alerts that fired or resolved."""
        health = self.health.get(url, TargetHealth())
        target_key: Key = (url, "")
        keys: list[Key] = [target_key]
        for spec in RULE_SPECS:
            if "target" in spec.scopes or role == "sidecar" and "sidecar" in spec.scopes:
                self._step(spec.name, target_key, now, history=self.histories.get(target_key), health=health)
        if role == "engine" and not fronted_by_sidecar:
            for label in engine_labels:
                key: Key = (url, label)
                keys.append(key)
                history = self.histories.get(key)
                if history is None:
                    continue
                for spec in RULE_SPECS:
                    if "engine" in spec.scopes:
                        self._step(spec.name, key, now, history=history, health=health, bare_engine=True)
        return self._publish(url, keys, now)

    def risk_of(self, url: str, since: float | None = None) -> dict[Key, Assessment]:
        """The latest collapse-risk assessment of each key of `url` (judged at or after `since`)."""
        out: dict[Key, Assessment] = {}
        for (rule, key), scratch in self.scratch.items():
            a = scratch.get("assessment") if rule == "collapse-risk" and key[0] == url else None
            if isinstance(a, Assessment) and (since is None or a.ts >= since):
                out[key] = a
        return out

    def _cause_firing(self, rule: str, key: Key, keys: list[Key]) -> str | None:
        """The first cause of `rule` firing on the same target (see `core.alerts.rules`), if any."""
        for cause in causes_of(rule):
            for other in keys:
                if other[1] != "" and key[1] != "" and other[1] != key[1]:
                    continue  # another engine label of the same target
                tracker = self.trackers.get((cause, other))
                if tracker is not None and tracker.firing:
                    return cause
        return None

    def _publish(self, url: str, keys: list[Key], now: float) -> list[Transition]:
        published = self.published.setdefault(url, set())
        labels = {k[1] for k in keys} | {k[1] for _, k in published}
        all_keys = [(url, label) for label in sorted(labels)]
        out: list[Transition] = []
        for key in all_keys:
            for spec in RULE_SPECS:
                rk = (spec.name, key)
                tracker = self.trackers.get(rk)
                if tracker is None:
                    continue
                cause = self._cause_firing(spec.name, key, all_keys) if tracker.firing else None
                want = tracker.firing and cause is None
                if want == (rk in published):
                    continue
                summary, values = self.last_summary.get(rk, ("", {}))
                if want:
                    published.add(rk)
                    out.append(
                        Transition(spec.name, key, "firing", now, SEVERITY[spec.name], summary, dict(values))
                    )
                    continue
                published.discard(rk)
                if cause is not None:
                    text = f"inhibited by {cause} (the cause, firing on this target): {summary}"
                else:
                    text = f"resolved: {summary}" if summary else "resolved"
                out.append(
                    Transition(
                        spec.name,
                        key,
                        "resolved",
                        now,
                        SEVERITY[spec.name],
                        text,
                        dict(values),
                        inhibited_by=cause,
                    )
                )
        return out


def replay(
    points: Iterable[tuple[float, Mapping[str, float | None]]],
    *,
    url: str = "replay",
    role: str = "sidecar",
    settings: AlertSettings | None = None,
    on_transition: Callable[[Transition], None] | None = None,
) -> list[Transition]:
    """Feed a recorded run (one (ts, signals) per second) through the evaluator; all transitions."""
    evaluator = AlertEvaluator(settings)
    out: list[Transition] = []
    for ts, values in points:
        evaluator.observe_scrape(url, ts, True)
        evaluator.observe((url, ""), ts, values)
        for transition in evaluator.evaluate_target(url, ts, role=role):
            out.append(transition)
            if on_transition is not None:
                on_transition(transition)
    return out
