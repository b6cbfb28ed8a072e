"""The Budgeter page's forecast (issue 16 item 3): what the collectors know of one engine -> simulator inputs.

Pure functions, no I/O, no clock (``now`` is passed in). They turn the rows the
collectors stored into the inputs of ``simulator.forecast_run.run_forecast``:

* ``start_sessions``: the sidecar's sessions as of its last ``/sessions``
  (``admitted``, ``parked``, ``waiting``; any other state is left out) with
  their context, the turns they have done, and whether an admitted one has a
  turn in flight (``in_flight``: already forwarded, so no control can hold it)
  or a turn held at the gate (``held``), and that turn's prompt
  (``pending_prompt``: ``pending_prompt_tokens``, the sidecar's count; from an
  older listing, a turn in flight's ``demand_tokens`` less ``output_budget``),
  how long ago its last activity was (``since_activity_s``, from the sidecar's
  ``last_activity``: the turn in flight was forwarded then, or the last turn
  finished then; the forecast's engine takes the turns in flight in that
  order, oldest first, as the engine's queue has them, and keeps the contexts
  used last in its cache, with those of its running batch, ``engine_running``:
  the engine's ``requests_running`` at its newest sample, the oldest turns in
  flight), how long ago the sidecar admitted it first and it arrived
  (``admitted_for_s``, ``arrived_for_s``, from ``admitted_at`` and
  ``arrived_at``: the budgeter parks the most recently admitted first and
  admits the waiting in order of arrival, so the forecast's budgeter must
  know them; without them every session was admitted "now" and the park set
  followed the session ids) and the output budget its client declared
  (``output_budget``, the sidecar's record; ``declared_budgets``: those of
  every session row, which new sessions draw from).
* ``shapes_from_turns``: the workload recorded over the last ``window_s``
  (30 minutes) of the turn trace (``turns`` table, outcome ``ok`` only):

  - a session *arrives* in the window when its first recorded turn is in the
    window and no turn of it is recorded before the window (the caller passes
    the rows since ``now - 2 * window_s``, so a session idle for less than a
    window is not taken for a new one); ``arrival_rate`` = arrivals / the span
    the trace covers: the window, or, when the first recorded turn (of the rows
    passed) arrived inside it, the time since that arrival (the sidecar, or its
    traffic, started less than a window ago: dividing by the whole window would
    take that young trace's rate for a fraction of it);
  - ``first_prompts``: the prompt tokens of those arrivals' first turns;
  - ``extras``: the new text of each later turn,
    ``prompt[k+1] - prompt[k] - completion[k]`` (clipped at 0): a session's
    next prompt is its context (prompt + completion of the turn before) plus
    one of these;
  - ``outputs``: completion tokens of every turn;
  - ``gaps``: the tool gap before each later turn: its arrival at the sidecar
    (``ts - latency_s - held_s``, ``ts`` being when a turn finished) minus the
    finish of the turn before;
  - ``session_turns``: the total turns of sessions that arrived in the window
    and have left (not in ``present``): how long a session lasts;
  - ``shared_prefix``: the median cached tokens of arrivals' first turns (what
    a new session finds cached: the shared system prompt).
* the cost model (``simulator.forecast_cost``): a fit file's (a per-step
  term it left at 0 taken from the recorded latencies), else one estimated
  from the recorded latencies alone.

* ``turn_overhead``: the part of a turn's latency, as the sidecar measures it
  (``latency_s``: forwarded to answered), that the engine's own clock does not
  account for: HTTP and tokenisation, or an engine process that falls behind
  its work. Each engine interval of the workload window (after the
  interval's previous sample, up to its ``ts``) is paired with the turns
  recorded finishing in it; the newest intervals are taken, back until they
  hold ``OVERHEAD_TURNS`` turns (or the window ends): the overhead grows with
  the load on the sidecar and its clients, and the forecast starts from now.
  (On the validation's collapse it rose from 0.012-0.015 s over the whole 10
  minutes to 0.021-0.023 s over the last minute, 0.023-0.026 s measured
  exactly there; docs/dashboard.md, "Validation", "Session 10".) Where intervals carry ``e2e_mean`` (the engine's
  exact mean arrival-to-finish latency, from its histogram's sum and count; a
  multi-rank engine's labels averaged), the overhead is the turns' mean ``latency_s`` minus the engine's mean, the
  engine's side weighted by the turns of each interval::

      overhead = sum_i (sum of latency_s in i - n_i * e2e_mean_i) / sum_i n_i

  over the intervals with both (robust to a turn the scrape boundary moves into
  the next interval). An interval ends at its sample's ``ts``, which the
  collectors stamp when the engine answered (``collectors.scrape_http``): the
  boundary must be the engine's read. Stamped when the request left (up to a
  simulated step, ~75 ms, earlier in the collapse demo), each interval took
  turns that finished before the engine's, and so were shorter by that offset
  times the turns' rise in latency (0.06 s a second there): the estimate came
  out 0-6 ms against the 5-7 ms measured (docs/dashboard.md, "Session 15").
  Without any ``e2e_mean`` (an engine
  without the histogram's ``_sum``, or rows recorded before the collectors kept
  it) it falls back to ``e2e_p50``: the median over the intervals of the
  turns' median ``latency_s`` minus ``e2e_p50``. That one is coarse: a
  collapsed engine's ``e2e_p50`` is an interpolation inside buckets seconds
  wide, which buried a 0.2-0.3 s overhead (docs/dashboard.md, "Validation").
  Either is at least 0 (0 with nothing to pair). The forecast delivers each
  finished turn that much later (``forecast_run``): a session's next turn
  waits for the answer as the client saw it (milliseconds on a real engine).

Nothing here reads the simulator's own settings (a ``SimConfig`` or the
simulated engine's flags): the engine is what the collectors saw, even when
it is the simulator. The KV block size is the engine's as the collectors
recorded it (``block_size``, from vLLM's ``cache_config_info``), else a fit
file's, else vLLM's default (``core.attribution.DEFAULT_BLOCK_SIZE``). What the
collectors never see is the scheduler limits (vLLM's defaults, as
``EngineConfig``'s).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.attribution import DEFAULT_BLOCK_SIZE
from core.budgeter import BudgeterConfig
from simulator.config import CostModel, EngineConfig
from simulator.forecast_cost import (
    ForecastError,
    as_float,
    as_int,
    as_num,
    cost_from_latencies,
    cost_with_fit,
)

WINDOW_S = 1800.0  # "what was recorded over the last 30 minutes"
START_STATES = ("admitted", "parked", "waiting")
OVERHEAD_TURNS = 500  # the turns ``turn_overhead`` is taken over, newest first (module doc)


@dataclass(frozen=True)
class StartSession:
    id: str
    state: str  # admitted | parked | waiting
    context_tokens: int
    turns_done: int
    parked_for_s: float = 0.0  # how long it has been parked already
    manual: bool = False
    pinned: bool = False
    in_flight: bool = False  # an admitted session with a turn already forwarded to the engine
    held: bool = False  # a turn of it waits at the sidecar's gate (parked or waiting, or not yet released)
    pending_prompt: int = 0  # that turn's prompt, in flight or held, as the sidecar counted it; 0: unknown
    output_budget: int = 0  # what its client declared (max_tokens, as the sidecar bounded it); 0: unknown
    since_activity_s: float = 0.0  # since its turn in flight was forwarded, or its last turn finished
    # since the sidecar first admitted it (None: never admitted), and since it arrived: the budgeter parks
    # the most recently admitted first and admits the waiting in order of arrival
    admitted_for_s: float | None = None
    arrived_for_s: float = 0.0


@dataclass(frozen=True)
class Shapes:
    """The recorded workload; the run draws new sessions and turns from these (empirical distributions)."""

    arrival_rate: float  # sessions/s
    first_prompts: tuple[int, ...]
    extras: tuple[int, ...]
    outputs: tuple[int, ...]
    gaps: tuple[float, ...]
    session_turns: tuple[int, ...]
    shared_prefix: int
    turns_seen: int


@dataclass(frozen=True)
class ForecastInputs:
    engine: EngineConfig
    cost: CostModel
    cost_source: str  # "fit" | "fit+latencies" | "latencies"
    sessions: tuple[StartSession, ...]
    shapes: Shapes
    output_budget: int  # the budget of a client that declares none (the current config's default)
    turn_overhead_s: float = 0.0  # latency outside the engine's clock, per turn (``turn_overhead``)
    turn_overhead_from: str = "none"  # what it rests on (``turn_overhead_basis``)
    # with a fit, the terms taken from the recorded latencies (``cost_with_fit``)
    cost_estimated: tuple[str, ...] = ()
    # the budgets the sidecar's sessions declared: each new session draws its own from them
    output_budgets: tuple[int, ...] = ()
    engine_running: int = 0  # requests the engine was running at its newest sample (``engine_running``)


def start_sessions(rows: Iterable[Mapping[str, Any]], now: float) -> tuple[StartSession, ...]:
    """Session rows (``session_id``, ``state``, ``context_tokens``, ``turns``, ``manual``, ``pinned``, ``data``)."""
    out = []
    for r in rows:
        if r.get("state") not in START_STATES:
            continue
        doc = r.get("data") if isinstance(r.get("data"), dict) else {}
        since = as_num(doc.get("parked_since")) if r["state"] == "parked" else None
        in_flight = r["state"] == "admitted" and as_int(doc.get("in_flight")) > 0
        active = as_num(doc.get("last_activity"))
        admitted, arrived = as_num(doc.get("admitted_at")), as_num(doc.get("arrived_at"))
        out.append(
            StartSession(
                id=str(r["session_id"]),
                state=str(r["state"]),
                context_tokens=as_int(r.get("context_tokens")),
                turns_done=as_int(r.get("turns")),
                parked_for_s=max(0.0, now - since) if since is not None else 0.0,
                in_flight=in_flight,
                held=not in_flight and as_int(doc.get("held")) > 0,
                pending_prompt=listed_pending_prompt(r, doc, in_flight),
                manual=bool(r.get("manual")),
                pinned=bool(r.get("pinned")),
                output_budget=as_int(doc.get("output_budget")),
                since_activity_s=max(0.0, now - active) if active is not None else 0.0,
                admitted_for_s=max(0.0, now - admitted) if admitted is not None else None,
                arrived_for_s=max(0.0, now - arrived) if arrived is not None else 0.0,
            )
        )
    return tuple(sorted(out, key=lambda s: s.id))


def listed_pending_prompt(row: Mapping[str, Any], doc: Mapping[str, Any], in_flight: bool) -> int:
    """The prompt of a session's turn in flight or held, from its listing: ``pending_prompt_tokens``
    (the sidecar's budgeter counts it), else, for a turn in flight, what the session's KV demand counts
    beyond its context and output budget (``demand_tokens``: the larger of the two, plus the budget;
    listings before the field); 0 where neither says."""
    if (pending := as_int(doc.get("pending_prompt_tokens"))) > 0:
        return pending
    if in_flight:
        beyond = as_int(doc.get("demand_tokens")) - as_int(doc.get("output_budget"))
        if beyond > as_int(row.get("context_tokens")):
            return beyond
    return 0


def declared_budgets(rows: Iterable[Mapping[str, Any]]) -> tuple[int, ...]:
    """The output budgets the session rows' clients declared (``data.output_budget``, > 0), sorted."""
    docs = (r.get("data") if isinstance(r.get("data"), dict) else {} for r in rows)
    return tuple(sorted(b for d in docs if (b := as_int(d.get("output_budget"))) > 0))


def shapes_from_turns(
    turns: Iterable[Mapping[str, Any]], now: float, present: Iterable[str] = (), window_s: float = WINDOW_S
) -> Shapes:
    """The workload of the turn rows (``ts``, ``session``, token counts, ``held_s``, ``latency_s``, ``outcome``)."""
    start = now - window_s
    by_session: dict[str, list[Mapping[str, Any]]] = {}
    for t in turns:
        ts = as_num(t.get("ts"))
        if t.get("outcome") != "ok" or not t.get("session") or ts is None or ts > now:
            continue
        by_session.setdefault(str(t["session"]), []).append(t)
    present_ids = set(present)
    first_prompts: list[int] = []
    firsts_cached: list[int] = []
    extras: list[int] = []
    outputs: list[int] = []
    gaps: list[float] = []
    session_turns: list[int] = []
    seen = 0
    first_began = min(
        (
            t["ts"] - (as_num(t.get("latency_s")) or 0.0) - (as_num(t.get("held_s")) or 0.0)
            for rows in by_session.values()
            for t in rows
        ),
        default=start,
    )
    span = max(0.0, now - max(start, first_began))
    for sid in sorted(by_session):
        rows = sorted(by_session[sid], key=lambda t: (t["ts"], t.get("id") or 0))
        arrived = rows[0]["ts"] >= start
        if arrived:
            first_prompts.append(as_int(rows[0].get("prompt_tokens")))
            firsts_cached.append(as_int(rows[0].get("cached_tokens")))
            if sid not in present_ids:
                session_turns.append(len(rows))
        for i, t in enumerate(rows):
            if t["ts"] < start:
                continue
            seen += 1
            outputs.append(as_int(t.get("completion_tokens")))
            if i == 0:
                continue
            prev = rows[i - 1]
            extras.append(
                max(
                    0,
                    as_int(t.get("prompt_tokens"))
                    - as_int(prev.get("prompt_tokens"))
                    - as_int(prev.get("completion_tokens")),
                )
            )
            began = t["ts"] - (as_num(t.get("latency_s")) or 0.0) - (as_num(t.get("held_s")) or 0.0)
            gaps.append(round(max(0.0, began - prev["ts"]), 6))
    return Shapes(
        arrival_rate=len(first_prompts) / span if span > 0 else 0.0,
        first_prompts=tuple(first_prompts),
        extras=tuple(extras),
        outputs=tuple(outputs),
        gaps=tuple(gaps),
        session_turns=tuple(session_turns),
        shared_prefix=int(statistics.median(firsts_cached)) if firsts_cached else 0,
        turns_seen=seen,
    )


def turn_overhead(
    turns: Iterable[Mapping[str, Any]],
    samples: Iterable[Mapping[str, Any]],
    now: float,
    window_s: float = WINDOW_S,
) -> float:
    """Seconds of a turn's sidecar latency beyond the engine's own (module doc); samples need ``ts``."""
    return turn_overhead_basis(turns, samples, now, window_s)[0]


def turn_overhead_basis(
    turns: Iterable[Mapping[str, Any]],
    samples: Iterable[Mapping[str, Any]],
    now: float,
    window_s: float = WINDOW_S,
) -> tuple[float, str]:
    """``turn_overhead`` and what it rests on: ``"e2e_mean"`` (exact means), ``"e2e_p50"`` (the
    fallback) or ``"none"`` (no engine interval with turns to pair: 0)."""
    done = sorted(
        (ts, lat)
        for t in turns
        if t.get("outcome") == "ok"
        and (ts := as_num(t.get("ts"))) is not None
        and (lat := as_num(t.get("latency_s"))) is not None
    )
    stamps = [ts for ts, _ in done]
    by_label: dict[float, dict[str, list[float]]] = {}
    for s in samples:
        ts = as_num(s.get("ts"))
        if ts is None or ts > now:
            continue
        at = by_label.setdefault(ts, {})  # every sample's time bounds an interval (any engine label)
        for key in ("e2e_mean", "e2e_p50"):
            value = as_num(s.get(key))
            if value is not None:
                at.setdefault(key, []).append(value)
    # a multi-rank engine's labels at one time: the mean of their values (the collectors keep no
    # per-rank request count to weigh them by; a balancer spreads the turns across the ranks)
    means = {
        ts: statistics.fmean(v["e2e_mean"]) if "e2e_mean" in v else math.nan for ts, v in by_label.items()
    }
    p50s = {ts: statistics.fmean(v["e2e_p50"]) for ts, v in by_label.items() if "e2e_p50" in v}
    times = sorted(means)
    excess = paired = 0.0
    deltas = []
    seen = 0
    # newest first, until OVERHEAD_TURNS turns: the overhead as it is now (it grows with the load)
    for prev, ts in reversed(list(zip(times, times[1:], strict=False))):
        if ts < now - window_s or seen >= OVERHEAD_TURNS:
            break
        lats = [lat for _, lat in done[bisect.bisect_right(stamps, prev) : bisect.bisect_right(stamps, ts)]]
        if not lats:
            continue
        seen += len(lats)
        if not math.isnan(means[ts]):
            excess += sum(lats) - len(lats) * means[ts]
            paired += len(lats)
        if ts in p50s:
            deltas.append(statistics.median(lats) - p50s[ts])
    if paired:
        return max(0.0, excess / paired), "e2e_mean"
    return (max(0.0, statistics.median(deltas)), "e2e_p50") if deltas else (0.0, "none")


def engine_running(samples: Iterable[Mapping[str, Any]], now: float) -> int:
    """The engine's ``requests_running`` at its newest sample at or before ``now`` (a multi-rank engine's
    labels added); 0 without one. Its running batch: the turns in flight longest, whose KV it holds."""
    newest, total = -math.inf, 0.0
    for s in samples:
        ts, value = as_num(s.get("ts")), as_num(s.get("requests_running"))
        if ts is None or value is None or ts > now or ts < newest:
            continue
        total = (total if ts == newest else 0.0) + value
        newest = ts
    return max(0, round(total))


def forecast_inputs(
    *,
    pool_tokens: Any,
    session_rows: Iterable[Mapping[str, Any]],
    turn_rows: Iterable[Mapping[str, Any]],
    latency_samples: Iterable[Mapping[str, Any]],
    fit: Mapping[str, Any] | None,
    current: BudgeterConfig,
    now: float,
    window_s: float = WINDOW_S,
    block_size: Any = None,
    e2e_samples: Iterable[Mapping[str, Any]] | None = None,
) -> ForecastInputs:
    """Everything a forecast runs on, from the collectors' rows only (``fit``: a fit file's ``set`` or None;
    ``block_size``: the engine's recorded KV block size, or None when the collectors have none;
    ``e2e_samples``: the engine's ``e2e_mean`` and ``e2e_p50`` samples with ``ts`` for ``turn_overhead``,
    as fine as recorded over the workload window; None: ``latency_samples``)."""
    pool = as_int(pool_tokens)
    block = as_int(block_size)
    if not block and fit is not None and "block_size" in fit:
        block = as_int(as_float(fit["block_size"]))
        if block < 1:
            raise ForecastError(f"fit: block_size={fit['block_size']!r} is not a positive number")
    block = block or DEFAULT_BLOCK_SIZE
    if pool < 4 * block:
        raise ForecastError(
            f"the engine's KV pool size is unknown or too small ({pool_tokens!r} tokens): "
            "nothing to simulate against"
        )
    rows = list(session_rows)
    turns, samples = list(turn_rows), list(latency_samples)
    sessions = start_sessions(rows, now)
    shapes = shapes_from_turns(turns, now, [str(r["session_id"]) for r in rows], window_s)
    if shapes.turns_seen == 0 and not sessions:
        raise ForecastError(
            f"no turns recorded in the last {window_s / 60:g} minutes and no sessions: "
            "no workload to draw from"
        )
    if not shapes.extras or not shapes.gaps or not shapes.outputs:
        raise ForecastError(
            f"too few turns recorded in the last {window_s / 60:g} minutes "
            f"({shapes.turns_seen}) to draw turn sizes and tool gaps from"
        )
    estimated: tuple[str, ...] = ()
    if fit is not None:
        cost, source, estimated = cost_with_fit(fit, samples, pool)
    else:
        cost, source = cost_from_latencies(samples, pool), "latencies"
    overhead, basis = turn_overhead_basis(
        turns, samples if e2e_samples is None else e2e_samples, now, window_s
    )
    return ForecastInputs(
        engine=EngineConfig(pool_tokens=pool, block_size=block),
        cost=cost,
        cost_source=source,
        sessions=sessions,
        shapes=shapes,
        output_budget=current.default_output_budget,
        turn_overhead_s=overhead,
        turn_overhead_from=basis,
        cost_estimated=estimated,
        output_budgets=declared_budgets(rows),
        engine_running=engine_running(samples, now),
    )
