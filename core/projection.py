"""Projected KV demand: what the admitted sessions will hold a horizon from now. Pure.

The collapse-risk model (`core.risk`) needs to see an overflow *coming*, not one that has already
happened: a burst of young sessions sits under the pool now and overflows it within a minute, while
a pool full of sessions near their last turn is about to empty. The budgeter knows each admitted
session's turns, context and admission time, and how many turns the sessions that ended had; this
module turns that into the demand expected ``horizon_s`` seconds from ``now``.

Inputs (``sessions``: the admitted sessions, anything with the `core.budgeter.SessionState`
attributes ``turns``, ``context_tokens``, ``demand_tokens`` and ``output_budget``; ``arrivals``: the arrival times of the sessions now in the system, any state;
``mean_turns``: the mean turn count of the sessions that ended, None before one has; ``turns_per_s``;
``now``: the clock, passed in):

* **per-turn growth** ``g``: the least-squares slope of ``context_tokens`` against ``turns`` over the
  admitted sessions with at least one finished turn (0 when they have fewer than two distinct turn
  counts; never negative). Its intercept at one turn, plus the mean output budget, is the demand of a
  new session after its first turn (``new_demand``).
* **turn period**: ``len(sessions) / turns_per_s``, the pace the engine delivers now (``turns_per_s``:
  turns completed per second recently). Not each session's past pace: when the engine slows down,
  sessions stop finishing too, and a projection that assumed their past pace would see them leave.
  ``turns_per_s`` 0: nobody advances within the horizon.
* **turns left**: ``length - n``, at least 1 (a session still in the system has its next turn), where
  ``length`` is ``mean_turns``. While no session has ended (``mean_turns`` None) the only basis is a
  lower bound: every session lasts at least as long as the oldest admitted one so far, which has
  not ended, so ``length`` is the largest ``turns`` of the admitted sessions plus 1 (its next turn).
  (Projecting that nobody ends, as before, made the projection alone reach full pressure at
  start-up, its weight then equal to the warning threshold, now under it: false alarms minutes
  before any overflow.)
* a session whose turns left fit in ``horizon_s / period`` ends within the horizon and contributes
  nothing; any other contributes ``demand_tokens + g * horizon_s / period``.
* **arrivals**: the sessions that arrived in the last ``arrival_window_s`` give a rate; the
  arrivals in the horizon each add ``new_demand``.

``projected_demand(...)`` returns the projected demand in tokens (0 with no session and no arrival).
The sidecar reports it as ``budgeter.projected_demand_tokens`` in ``/state`` and the simulator records
it per second; `core.risk` reads it against the pool (``projected_demand_fraction``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class SessionView(Protocol):
    @property
    def turns(self) -> int: ...

    @property
    def context_tokens(self) -> int: ...

    @property
    def demand_tokens(self) -> int: ...

    @property
    def output_budget(self) -> int: ...


ARRIVAL_WINDOW_S = 60.0


def growth_per_turn(sessions: Sequence[SessionView]) -> tuple[float, float]:
    """(slope, context at one turn) of context_tokens against turns over sessions with a finished turn."""
    pts = [(float(s.turns), float(s.context_tokens)) for s in sessions if s.turns >= 1]
    if not pts:
        return 0.0, 0.0
    mn = sum(n for n, _ in pts) / len(pts)
    mc = sum(c for _, c in pts) / len(pts)
    snn = sum((n - mn) ** 2 for n, _ in pts)
    if snn <= 0:
        return 0.0, mc
    slope = max(0.0, sum((n - mn) * (c - mc) for n, c in pts) / snn)
    return slope, mc - slope * (mn - 1.0)


def session_length(sessions: Sequence[SessionView], mean_turns: float | None) -> float:
    """Turns a session is expected to last: ``mean_turns``, else the oldest admitted session's turns + 1."""
    if mean_turns is not None:
        return mean_turns
    return max((s.turns for s in sessions), default=0) + 1.0


def projected_demand(
    sessions: Iterable[SessionView],
    arrivals: Iterable[float],
    mean_turns: float | None,
    turns_per_s: float,
    now: float,
    horizon_s: float,
    arrival_window_s: float = ARRIVAL_WINDOW_S,
) -> float:
    """Demand in tokens expected ``horizon_s`` from ``now`` (see the module docstring)."""
    if horizon_s < 0 or arrival_window_s <= 0:
        raise ValueError(
            f"projection horizon must be >= 0 and arrival window > 0, got {horizon_s}, {arrival_window_s}"
        )
    adm = list(sessions)
    g, first = growth_per_turn(adm)
    ahead = horizon_s * max(0.0, turns_per_s) / len(adm) if adm else 0.0  # turns per session
    length = session_length(adm, mean_turns)
    total = 0.0
    for s in adm:
        if ahead > 0 and max(length - s.turns, 1.0) <= ahead:
            continue  # ends within the horizon: its demand leaves
        total += s.demand_tokens + g * ahead
    budget = sum(s.output_budget for s in adm) / len(adm) if adm else 0.0
    recent = sum(1 for t in arrivals if now - arrival_window_s < t <= now)
    total += recent / arrival_window_s * horizon_s * (first + budget)
    return total
