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
    Divergence ``D = R_r - R_t`` >= ``thin_reuse_enter`` (0.5) for ``thin_reuse_for_s``;
    resolves once ``D`` < ``thin_reuse_exit`` (0.4) for ``thin_reuse_clear_s``.
``demand-over-band`` (warning, sidecars)
    demand / pool above the high band (the sidecar's ``band_high``, default 0.95) for
    ``demand_for_s``: the budgeter is not bringing demand down (control off, or everything
    pinned). Resolves once demand / pool <= high band - ``demand_exit_margin`` for ``demand_clear_s``.
``compaction-in-thin-reuse`` (critical, sidecars)
    A compaction was *granted* while thin-reuse held (the decision's own divergence, else the
    sidecar's latest ``D``, >= ``thin_reuse_enter``). Event rule: fires at once, resolves
    ``compaction_hold_s`` after the last such grant.
``collapse`` (critical; sidecars, and engines no sidecar fronts)
    Metastable collapse, defined over a sliding window of ``collapse_window_s`` (W, 300 s) ending now,
    with the hit-ratio test of `core.runs` (the simulator's own "degraded" judgement: R_t over the
    last 5 minutes <= 0.3) plus the two symptoms that make it collapse rather than a cold cache.
    With *hit ratio* = sidecar ``token_weighted`` (R_t; engine ``engine_hit_ratio`` when the
    sidecar has none, or for a bare engine), *throughput* = ``turns_per_s`` (bare engine:
    ``generation_tokens_per_s``) and *backlog* = ``sessions_in_system`` (bare engine:
    ``requests_running + requests_waiting``), the condition holds when all three are true:

    1. **hit ratio low**: its mean over W is at most ``collapse_hit_below`` (0.3);
    2. **throughput down**: its mean over W is below ``collapse_throughput_fraction`` (0.6) of the
       *reference throughput*, the highest W-mean observed in the preceding
       ``collapse_baseline_s`` (30 min); with no reference yet (under W of history) it is not judged;
    3. **backlog growing**: backlog at the end of W exceeds backlog at its start by at least
       ``collapse_backlog_growth`` (2) — or, once the alert is firing, backlog has not fallen.

    Each window needs samples covering at least half of W, else the rule says ``None``. The
    condition must hold for ``collapse_for_s`` (15 s) to fire (it is judged every
    ``collapse_eval_every_s``, 5 s, per key: a 5-minute window does not change faster). It resolves when the hit-ratio mean
    over W is back to at least ``collapse_recover_hit`` (0.5) and backlog is not growing, held for
    ``collapse_clear_s`` (30 s). Parking sessions (which empties the pool of stale prefixes) is
    what makes this happen; stopping arrivals alone does not.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Literal

from core import runs
from core import signals as sig

RULES = ("target-down", "stale-data", "thin-reuse", "demand-over-band", "compaction-in-thin-reuse", "collapse")
SEVERITY: dict[str, str] = {
    "target-down": "critical",
    "stale-data": "warning",
    "thin-reuse": "warning",
    "demand-over-band": "warning",
    "compaction-in-thin-reuse": "critical",
    "collapse": "critical",
}

Key = tuple[str, str]  # (target URL, engine label)

# The only signals the rules read: histories keep nothing else (memory per target stays small).
RULE_SIGNALS = frozenset({
    sig.TOKEN_WEIGHTED, sig.REQUEST_WEIGHTED, sig.DIVERGENCE, sig.ENGINE_HIT_RATIO, sig.TURNS_PER_S,
    sig.GENERATION_TOKENS_PER_S, sig.SESSIONS_IN_SYSTEM, sig.REQUESTS_RUNNING, sig.REQUESTS_WAITING,
    sig.DEMAND_FRACTION, sig.DEMAND_TOKENS, sig.POOL_TOKENS, sig.BAND_HIGH,
})


@dataclass(frozen=True)
class AlertSettings:
    """Thresholds and durations; rejects bad values at construction."""

    down_after_failures: int = 3
    down_for_s: float = 5.0
    up_for_s: float = 5.0
    stale_after_s: float = 30.0
    thin_reuse_enter: float = 0.5
    thin_reuse_exit: float = 0.4
    thin_reuse_for_s: float = 30.0
    thin_reuse_clear_s: float = 30.0
    demand_band_high: float = 0.95
    demand_exit_margin: float = 0.03
    demand_for_s: float = 60.0
    demand_clear_s: float = 30.0
    compaction_hold_s: float = 600.0
    collapse_window_s: float = runs.WINDOW_MIN * 60.0
    collapse_baseline_s: float = 1800.0
    collapse_hit_below: float = runs.DEGRADED_THRESHOLD
    collapse_recover_hit: float = 0.5
    collapse_throughput_fraction: float = 0.6
    collapse_backlog_growth: float = 2.0
    collapse_for_s: float = 15.0
    collapse_clear_s: float = 30.0
    collapse_eval_every_s: float = 5.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"alert setting {f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"alert setting {f.name} must not be negative, got {value}")
        if self.thin_reuse_exit >= self.thin_reuse_enter:
            raise ValueError("thin_reuse_exit must be below thin_reuse_enter (hysteresis), "
                             f"got {self.thin_reuse_exit} >= {self.thin_reuse_enter}")
        if self.collapse_recover_hit <= self.collapse_hit_below:
            raise ValueError("collapse_recover_hit must be above collapse_hit_below (hysteresis), "
                             f"got {self.collapse_recover_hit} <= {self.collapse_hit_below}")
        if not 0 < self.collapse_throughput_fraction < 1:
            raise ValueError(f"collapse_throughput_fraction must be in (0, 1), got {self.collapse_throughput_fraction}")
        if self.collapse_window_s <= 0:
            raise ValueError(f"collapse_window_s must be positive, got {self.collapse_window_s}")
        if self.down_after_failures < 1:
            raise ValueError(f"down_after_failures must be at least 1, got {self.down_after_failures}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> AlertSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown alert setting(s) {unknown}; known: {sorted(known)}")
        return cls(**data)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Condition:
    """A rule's verdict at one instant: holds (True), clear (False) or unknown (None)."""

    active: bool | None
    values: dict[str, float | None] = field(default_factory=dict)
    summary: str = ""
    # When True the tracker treats False as "exit condition met" (rules compute hysteresis themselves).
    exit_met: bool | None = None


@dataclass(frozen=True)
class Transition:
    rule: str
    key: Key
    event: Literal["firing", "resolved"]
    ts: float
    severity: str
    summary: str
    values: dict[str, float | None]


@dataclass
class RuleTracker:
    """Minimum-duration state machine of one (rule, key)."""

    for_s: float
    clear_s: float
    firing: bool = False
    pending_since: float | None = None
    clearing_since: float | None = None

    def update(self, ts: float, condition: Condition) -> Literal["firing", "resolved"] | None:
        if condition.active is None:
            return None  # unknown: neither fires nor resolves, and interrupts nothing
        if not self.firing:
            self.clearing_since = None
            if condition.active:
                if self.pending_since is None:
                    self.pending_since = ts
                if ts - self.pending_since >= self.for_s:
                    self.firing = True
                    self.pending_since = None
                    return "firing"
            else:
                self.pending_since = None
            return None
        exit_met = condition.exit_met if condition.exit_met is not None else not condition.active
        if exit_met:
            if self.clearing_since is None:
                self.clearing_since = ts
            if ts - self.clearing_since >= self.clear_s:
                self.firing = False
                self.clearing_since = None
                return "resolved"
        else:
            self.clearing_since = None
        return None


class History:
    """Recent (ts, signals) points of one key, oldest first, trimmed to `keep_s`."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self.points: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, ts: float, values: Mapping[str, float | None]) -> None:
        clean = {k: float(v) for k, v in values.items()
                 if k in RULE_SIGNALS and v is not None and math.isfinite(v)}
        if not clean:
            return
        if self.points and ts <= self.points[-1][0]:
            self.points[-1][1].update(clean)  # same instant (engine + sidecar merged): combine
        else:
            self.points.append((ts, clean))
        while self.points and self.points[0][0] < ts - self.keep_s:
            self.points.popleft()

    def latest(self, name: str) -> float | None:
        for _, values in reversed(self.points):
            if name in values:
                return values[name]
        return None

    def window(self, name: str, start: float, end: float) -> list[tuple[float, float]]:
        return [(t, v[name]) for t, v in self.points if start < t <= end and name in v]


def _mean(points: list[tuple[float, float]]) -> float | None:
    return sum(v for _, v in points) / len(points) if points else None


def _covered(points: list[tuple[float, float]], start: float, end: float) -> bool:
    return len(points) >= 2 and points[-1][0] - points[0][0] >= 0.5 * (end - start)


def _first_present(history: History, names: Iterable[str], start: float, end: float) -> tuple[str, list[tuple[float, float]]]:
    for name in names:
        points = history.window(name, start, end)
        if points:
            return name, points
    return "", []


def _backlog_points(history: History, start: float, end: float, bare_engine: bool) -> list[tuple[float, float]]:
    if not bare_engine:
        points = history.window(sig.SESSIONS_IN_SYSTEM, start, end)
        if points:
            return points
    out = []
    for t, values in history.points:
        if start < t <= end and sig.REQUESTS_RUNNING in values and sig.REQUESTS_WAITING in values:
            out.append((t, values[sig.REQUESTS_RUNNING] + values[sig.REQUESTS_WAITING]))
    return out


@dataclass
class CollapseReference:
    """Highest windowed throughput seen recently (the 'healthy' level), per key."""

    samples: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, ts: float, window_mean: float, keep_s: float) -> None:
        self.samples.append((ts, window_mean))
        while self.samples and self.samples[0][0] < ts - keep_s:
            self.samples.popleft()

    def best(self) -> float | None:
        return max((v for _, v in self.samples), default=None)


def collapse_condition(history: History, now: float, settings: AlertSettings, reference: CollapseReference,
                       *, firing: bool, bare_engine: bool = False) -> Condition:
    """The ``collapse`` rule at `now` (see the module docstring for the definition)."""
    w = settings.collapse_window_s
    start = now - w
    hit_names = (sig.ENGINE_HIT_RATIO,) if bare_engine else (sig.TOKEN_WEIGHTED, sig.ENGINE_HIT_RATIO)
    thr_names = (sig.GENERATION_TOKENS_PER_S,) if bare_engine else (sig.TURNS_PER_S,)
    _, hit_pts = _first_present(history, hit_names, start, now)
    thr_name, thr_pts = _first_present(history, thr_names, start, now)
    backlog = _backlog_points(history, start, now, bare_engine)
    if not (_covered(hit_pts, start, now) and _covered(thr_pts, start, now) and _covered(backlog, start, now)):
        return Condition(None)
    hit = _mean(hit_pts)
    thr = _mean(thr_pts)
    assert hit is not None and thr is not None
    ref = reference.best()
    # The reference only learns from windows that are not themselves collapsed.
    if not firing:
        reference.add(now, thr, settings.collapse_baseline_s)
    growth = backlog[-1][1] - backlog[0][1]
    values: dict[str, float | None] = {
        "hit_ratio_mean": round(hit, 4), "throughput_mean": round(thr, 4),
        "throughput_reference": None if ref is None else round(ref, 4),
        "backlog": backlog[-1][1], "backlog_growth": growth, "window_s": w,
    }
    if ref is None or ref <= 0:
        return Condition(None, values)
    hit_low = hit <= settings.collapse_hit_below
    thr_down = thr < settings.collapse_throughput_fraction * ref
    growing = growth >= settings.collapse_backlog_growth or (firing and growth >= 0)
    active = hit_low and thr_down and growing
    recovered = hit >= settings.collapse_recover_hit and growth <= 0
    unit = "turns/s" if thr_name == sig.TURNS_PER_S else "tokens/s"
    backlog_name = "requests running+waiting" if bare_engine else "sessions in system"
    summary = (f"collapse: hit ratio {hit:.2f} (<= {settings.collapse_hit_below}) over the last {w:.0f} s, "
               f"throughput {thr:.2f} {unit} vs {ref:.2f} healthy, {backlog_name} {backlog[-1][1]:.0f} "
               f"({growth:+.0f} in {w:.0f} s). Park sessions (budgeter-park) to recover; stopping arrivals "
               "alone does not.")
    return Condition(active, values, summary, exit_met=recovered)


@dataclass
class TargetHealth:
    """What the collector knows about a target's scraping, passed to the evaluator."""

    last_attempt_ts: float | None = None
    last_attempt_ok: bool | None = None
    last_success_ts: float | None = None
    consecutive_failures: int = 0
    failing_since: float | None = None
    last_error: str | None = None


class AlertEvaluator:
    """All rules for all keys. Feed it with `observe` / `observe_compaction`, then `evaluate`."""

    def __init__(self, settings: AlertSettings | None = None) -> None:
        self.settings = settings or AlertSettings()
        self._keep = self.settings.collapse_window_s + 30.0
        self.histories: dict[Key, History] = {}
        self.trackers: dict[tuple[str, Key], RuleTracker] = {}
        self.references: dict[Key, CollapseReference] = {}
        self.health: dict[str, TargetHealth] = {}
        self.last_thin_grant: dict[Key, float] = {}
        self.last_summary: dict[tuple[str, Key], tuple[str, dict[str, float | None]]] = {}
        self._collapse_evaluated: dict[Key, float] = {}

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
        if d is not None and d >= self.settings.thin_reuse_enter:
            self.last_thin_grant[key] = max(ts, self.last_thin_grant.get(key, ts))
            self.last_summary[("compaction-in-thin-reuse", key)] = (
                f"compaction granted at D = {d:.2f} (thin reuse, >= {self.settings.thin_reuse_enter}): "
                "it invalidates every cached block below the rewrite; defer compaction while D is high",
                {"divergence": round(d, 4), "decision_ts": ts})
            return True
        return False

    def update_settings(self, settings: AlertSettings) -> None:
        """New thresholds and durations (a config reload); alerts in progress keep their state."""
        self.settings = settings
        self._keep = settings.collapse_window_s + 30.0
        for history in self.histories.values():
            history.keep_s = self._keep
        for (rule, _key), tracker in self.trackers.items():
            tracker.for_s, tracker.clear_s = self._durations(rule)

    def restore_firing(self, rule: str, key: Key) -> None:
        """Mark (rule, key) as already firing (an open alert found in the database at start-up)."""
        self._tracker(rule, key).firing = True

    def forget_target(self, url: str) -> None:
        for key in [k for k in self.histories if k[0] == url]:
            del self.histories[key]
        self.health.pop(url, None)

    # -- evaluation ---------------------------------------------------------------------------

    def _durations(self, rule: str) -> tuple[float, float]:
        s = self.settings
        return {
            "target-down": (s.down_for_s, s.up_for_s), "stale-data": (0.0, 0.0),
            "thin-reuse": (s.thin_reuse_for_s, s.thin_reuse_clear_s),
            "demand-over-band": (s.demand_for_s, s.demand_clear_s),
            "compaction-in-thin-reuse": (0.0, 0.0), "collapse": (s.collapse_for_s, s.collapse_clear_s),
        }[rule]

    def _tracker(self, rule: str, key: Key) -> RuleTracker:
        tracker = self.trackers.get((rule, key))
        if tracker is None:
            tracker = self.trackers[(rule, key)] = RuleTracker(*self._durations(rule))
        return tracker

    def _collapse_due(self, key: Key, now: float) -> bool:
        """Collapse looks at W seconds of history: evaluating it more than once a second (a scrape
        and the sweep in the same second) or more often than collapse_eval_every_s is wasted work."""
        last = self._collapse_evaluated.get(key)
        if last is not None and now - last < self.settings.collapse_eval_every_s:
            return False
        self._collapse_evaluated[key] = now
        return True

    def _step(self, rule: str, key: Key, now: float, condition: Condition, out: list[Transition]) -> None:
        tracker = self._tracker(rule, key)
        if condition.active is not None and condition.summary:
            self.last_summary[(rule, key)] = (condition.summary, condition.values)
        event = tracker.update(now, condition)
        if event is not None:
            summary, values = self.last_summary.get((rule, key), (condition.summary, condition.values))
            if event == "resolved":
                summary = f"resolved: {summary}" if summary else "resolved"
            out.append(Transition(rule, key, event, now, SEVERITY[rule], summary, dict(values)))

    def evaluate_target(self, url: str, now: float, *, role: str, engine_labels: Iterable[str] = ("",),
                        fronted_by_sidecar: bool = False) -> list[Transition]:
        """Run every rule that applies to one target; returns the alerts that fired or resolved."""
        out: list[Transition] = []
        s = self.settings
        health = self.health.get(url, TargetHealth())
        target_key: Key = (url, "")
        self._step("target-down", target_key, now, self._down_condition(health, now), out)
        self._step("stale-data", target_key, now, self._stale_condition(health, now), out)
        if role == "sidecar":
            history = self.histories.get(target_key)
            if history is not None:
                self._step("thin-reuse", target_key, now, self._thin_condition(history, now), out)
                self._step("demand-over-band", target_key, now, self._demand_condition(history, now), out)
                if self._collapse_due(target_key, now):
                    reference = self.references.setdefault(target_key, CollapseReference())
                    self._step("collapse", target_key, now,
                               collapse_condition(history, now, s, reference,
                                                  firing=self._tracker("collapse", target_key).firing), out)
            last = self.last_thin_grant.get(target_key)
            grant = Condition(None) if last is None else Condition(now - last < s.compaction_hold_s)
            if last is not None:
                grant = Condition(grant.active, self.last_summary.get(("compaction-in-thin-reuse", target_key),
                                                                      ("", {}))[1],
                                  self.last_summary.get(("compaction-in-thin-reuse", target_key), ("", {}))[0])
            self._step("compaction-in-thin-reuse", target_key, now, grant, out)
        elif role == "engine" and not fronted_by_sidecar:
            for label in engine_labels:
                key: Key = (url, label)
                history = self.histories.get(key)
                if history is None or not self._collapse_due(key, now):
                    continue
                self._step("collapse", key, now,
                           collapse_condition(history, now, s, self.references.setdefault(key, CollapseReference()),
                                              firing=self._tracker("collapse", key).firing, bare_engine=True), out)
        return out

    def _down_condition(self, health: TargetHealth, now: float) -> Condition:
        if health.last_attempt_ts is None:
            return Condition(None)
        s = self.settings
        failing = (health.consecutive_failures >= s.down_after_failures and health.failing_since is not None)
        values: dict[str, float | None] = {"consecutive_failures": float(health.consecutive_failures),
                                           "last_success_ts": health.last_success_ts}
        if not failing:
            return Condition(False, values)
        since = health.failing_since or now
        return Condition(True, values,
                         f"target down for {now - since:.0f} s ({health.consecutive_failures} failed scrapes): "
                         f"{health.last_error or 'unknown error'}. Check the process and the URL.")

    def _stale_condition(self, health: TargetHealth, now: float) -> Condition:
        if health.last_success_ts is None:
            return Condition(None)
        age = now - health.last_success_ts
        values: dict[str, float | None] = {"age_s": round(age, 1), "last_success_ts": health.last_success_ts}
        if health.last_attempt_ok is False:
            return Condition(False, values)  # failing: that is target-down's business
        if age > self.settings.stale_after_s:
            return Condition(True, values, f"no fresh data for {age:.0f} s although the target did not fail: "
                             "scrapes are not happening (hung connection, stuck or overloaded collector).")
        return Condition(False, values)

    def _thin_condition(self, history: History, now: float) -> Condition:
        d = history.latest(sig.DIVERGENCE)
        if d is None:
            return Condition(None)
        s = self.settings
        rt = history.latest(sig.TOKEN_WEIGHTED)
        rr = history.latest(sig.REQUEST_WEIGHTED)
        values = {"divergence": round(d, 4), "token_weighted": rt, "request_weighted": rr}
        summary = (f"thin reuse: D = R_r - R_t = {d:.2f} (>= {s.thin_reuse_enter}); R_r "
                   f"{'?' if rr is None else f'{rr:.2f}'} looks healthy but R_t "
                   f"{'?' if rt is None else f'{rt:.2f}'} is low. Defer compaction; check for a storm of "
                   "short low-overlap requests.")
        return Condition(d >= s.thin_reuse_enter, values, summary, exit_met=d < s.thin_reuse_exit)

    def _demand_condition(self, history: History, now: float) -> Condition:
        fraction = history.latest(sig.DEMAND_FRACTION)
        if fraction is None:
            return Condition(None)
        high = history.latest(sig.BAND_HIGH)
        high = self.settings.demand_band_high if high is None else high
        values = {"demand_fraction": round(fraction, 4), "band_high": high,
                  "demand_tokens": history.latest(sig.DEMAND_TOKENS), "pool_tokens": history.latest(sig.POOL_TOKENS)}
        summary = (f"demand {fraction:.0%} of the KV pool, above the high band {high:.0%}: sessions' prefixes "
                   "will evict each other. Check the budgeter is on (budgeter-park) and not everything is pinned.")
        return Condition(fraction > high, values, summary,
                         exit_met=fraction <= high - self.settings.demand_exit_margin)


def replay(points: Iterable[tuple[float, Mapping[str, float | None]]], *, url: str = "replay",
           role: str = "sidecar", settings: AlertSettings | None = None,
           on_transition: Callable[[Transition], None] | None = None) -> list[Transition]:
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
