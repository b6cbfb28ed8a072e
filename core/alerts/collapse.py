"""The ``collapse`` rule: metastable collapse judged over a sliding window.

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

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from core import signals as sig

from .conditions import RuleContext
from .settings import AlertSettings
from .tracking import Condition, History


def _mean(points: list[tuple[float, float]]) -> float | None:
    return sum(v for _, v in points) / len(points) if points else None


def _covered(points: list[tuple[float, float]], start: float, end: float) -> bool:
    return len(points) >= 2 and points[-1][0] - points[0][0] >= 0.5 * (end - start)


def _first_present(
    history: History, names: Iterable[str], start: float, end: float
) -> tuple[str, list[tuple[float, float]]]:
    for name in names:
        points = history.window(name, start, end)
        if points:
            return name, points
    return "", []


def _backlog_points(
    history: History, start: float, end: float, bare_engine: bool
) -> list[tuple[float, float]]:
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


def collapse_condition(
    history: History,
    now: float,
    settings: AlertSettings,
    reference: CollapseReference,
    *,
    firing: bool,
    bare_engine: bool = False,
) -> Condition:
    """The ``collapse`` rule at `now` (see the module docstring for the definition)."""
    w = settings.collapse_window_s
    start = now - w
    hit_names = (sig.ENGINE_HIT_RATIO,) if bare_engine else (sig.TOKEN_WEIGHTED, sig.ENGINE_HIT_RATIO)
    thr_names = (sig.GENERATION_TOKENS_PER_S,) if bare_engine else (sig.TURNS_PER_S,)
    _, hit_pts = _first_present(history, hit_names, start, now)
    thr_name, thr_pts = _first_present(history, thr_names, start, now)
    backlog = _backlog_points(history, start, now, bare_engine)
    if not (
        _covered(hit_pts, start, now) and _covered(thr_pts, start, now) and _covered(backlog, start, now)
    ):
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
        "hit_ratio_mean": round(hit, 4),
        "throughput_mean": round(thr, 4),
        "throughput_reference": None if ref is None else round(ref, 4),
        "backlog": backlog[-1][1],
        "backlog_growth": growth,
        "window_s": w,
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
    summary = (
        f"collapse: hit ratio {hit:.2f} (<= {settings.collapse_hit_below}) over the last {w:.0f} s, "
        f"throughput {thr:.2f} {unit} vs {ref:.2f} healthy, {backlog_name} {backlog[-1][1]:.0f} "
        f"({growth:+.0f} in {w:.0f} s). Park sessions (budgeter-park) to recover; stopping arrivals "
        "alone does not."
    )
    return Condition(active, values, summary, exit_met=recovered)


def collapse_rule(ctx: RuleContext) -> Condition:
    """`collapse_condition` for the evaluator: the reference lives in the (rule, key)'s scratch."""
    if ctx.history is None:
        return Condition(None)
    reference = ctx.scratch.setdefault("reference", CollapseReference())
    return collapse_condition(
        ctx.history, ctx.now, ctx.settings, reference, firing=ctx.firing, bare_engine=ctx.bare_engine
    )
