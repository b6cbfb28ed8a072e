"""Run a forecast: the engine's current sessions and the recorded workload, forward through the simulator.

``run_forecast(inputs, config, minutes, seed)`` simulates ``minutes`` from now
with the sidecar's budgeter (``core.budgeter``, the sidecar's own code) in
``config``. Its inputs come from ``simulator.forecast`` (the collectors' rows
only). The run:

* *warm-up* (before t = 0, not counted): the admitted sessions' contexts are
  prefilled once, least recently active first (``since_activity_s``), and
  last the engine's running batch (the ``engine_running`` turns in flight
  longest, which the engine is serving and holds the KV of: their whole
  prompts, youngest first and the oldest last, so a pool too small for the
  batch keeps the turns the engine took first), so the cache holds what the
  engine holds, as far as the pool allows; parked and waiting sessions start
  uncached. (Without the running batch, the preview of a collapsed engine's
  recovery started by prefilling again what the engine had: it parked 90
  sessions in its first 20 s where the live sidecar parked 138;
  docs/dashboard.md, "Validation".) A running turn reports the cached tokens
  its prompt's warm-up found, not the whole prompt its warm-up left cached:
  an engine reports the prefix hits it found when it took the turn, before
  t = 0 (in a collapse, little). Counted whole, the preview's turns finishing
  in the first 30 s after the switch had 12.6-13.0k uncached tokens each
  where the live ones had 14.7-15.3k (docs/dashboard.md, "Session 16");
* *the running batch is part way through its answers*: the j-th oldest of
  its K turns has ``(j + 0.5) / K`` of its answer still to come at t = 0 (an
  engine's batch holds its turns at every stage; the oldest entered first),
  and counts its whole answer when it finishes. (Started all from their
  first token, the batch finished together, seconds late: on the validation
  the preview had no turn finished in its first 4 s where the live engine
  finished 24; docs/dashboard.md, "Session 10");
* *sessions as of now*: the budgeter starts with them in their states, their
  admission and arrival times (so it parks the most recently admitted first,
  as the sidecar's does); an
  admitted one with a turn in flight has it in the engine at t = 0 (it was
  forwarded under the current config: no control holds it; a collapsed
  engine's backlog is there to drain), in the order they were forwarded
  (the engine's queue is first come, first served), its latency counted from
  when it was forwarded; one whose turn is held at the sidecar's gate asks
  for it at t = 0 (held until the budgeter admits it); every other one asks
  for its next turn after a tool gap drawn from the recorded gaps (a parked
  or waiting one is held until the budgeter admits it). A turn in flight or
  held has the prompt the sidecar counted for it (``pending_prompt``): a new
  session's first turn has no context to add new text to. (Given the
  context plus a later turn's new text, the collapse's new sessions in
  flight started with 665-token first prompts where theirs had 6,626: the
  preview admitted ~6,000 tokens too many for each, and drained its parked
  sessions early; docs/dashboard.md, "Session 12".) Each lasts a
  total number of turns drawn from the recorded totals above the turns it has
  done (one more turn when no recorded total is above);
* *new sessions*: Poisson arrivals at the recorded rate, first prompt and
  total turns drawn from the recorded ones;
* each session declares its own output budget to the budgeter, as its client
  did (``StartSession.output_budget``; a new session draws one from
  ``ForecastInputs.output_budgets``; the config's default where none is
  known): the sidecar counts a declared ``max_tokens``, so a forecast on the
  default (1024 where the demo's clients declare 150) would admit fewer
  sessions than the sidecar does;
* the budgeter admits queued sessions after every finished turn and once a
  second, as the sidecar does (it releases after each turn and on its tick):
  the room a turn or a session leaves goes to a parked one at once;
* a finished turn reaches its session ``turn_overhead_s`` later (the latency
  the sidecar recorded beyond the engine's own: ``forecast.turn_overhead``):
  its latency, and the session's next turn, count from then;
* each later turn's prompt is the context plus recorded new text
  (``extras``), its answer a recorded completion size; every draw comes from a
  per-session random stream seeded by ``seed``, so the same seed offers the
  same sessions to every config.

The summary: ``r_t`` (cached / prompt tokens of turns finished in the run),
``r_t_last_5min``, ``turns_per_s``, ``p95_turn_latency_s`` (gate arrival to
finish, holding included), ``parked_mean`` / ``parked_end`` / ``parked_max``,
``parked_session_minutes`` (time parked summed over sessions) and
``waiting_end``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.budgeter import Budgeter, BudgeterConfig
from simulator.content import SegmentContent
from simulator.engine import Engine, Request
from simulator.forecast import ForecastInputs, Shapes, StartSession
from simulator.loop import EventLoop

Progress = Callable[[float], None]


@dataclass(eq=False)
class _Sess:
    id: str
    content: SegmentContent
    rng: random.Random
    context: int
    left: int  # turns still to do
    gated_at: float = 0.0
    forwarded_at: float = 0.0
    held: int | None = None  # prompt of a held turn
    answered: int = 0  # tokens of the turn in flight's answer the engine had produced before t = 0
    found: int | None = None  # a running turn's cached count, as the engine found it before t = 0
    budget: int = 0  # the output budget its client declares to the budgeter


@dataclass
class _Acc:
    n: int
    turns: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.turns, self.prompt, self.cached = [0] * self.n, [0] * self.n, [0] * self.n

    def add(self, t: float, prompt: int, cached: int, latency: float) -> None:
        s = min(self.n - 1, max(0, math.ceil(t) - 1))
        self.turns[s] += 1
        self.prompt[s] += prompt
        self.cached[s] += cached
        self.latencies.append(latency)


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _content(shared: int, sid: str) -> SegmentContent:
    segs: list[tuple[Any, int]] = [("sys", shared)] if shared > 0 else []
    return SegmentContent([*segs, (("s", sid), 1 << 40)])


def _total_turns(rng: random.Random, totals: tuple[int, ...], done: int) -> int:
    above = [t for t in totals if t > done]
    return rng.choice(above) - done if above else 1


def _admitted_at(s: StartSession, t0: float) -> float | None:
    """When the sidecar first admitted ``s``, on the run's clock; an admitted one of unknown age: ``t0``."""
    if s.admitted_for_s is not None:
        return t0 - s.admitted_for_s
    return t0 if s.state == "admitted" else None


def pending_prompt(s: StartSession, rng: random.Random, sh: Shapes) -> int:
    """The prompt of ``s``'s turn in flight or held at the gate: as the sidecar counted it (where that is
    above the context: a later turn's prompt holds its context), else its context plus drawn new text, a
    first turn (no context yet) a drawn first prompt."""
    if s.pending_prompt > s.context_tokens:
        return s.pending_prompt
    if s.turns_done == 0 and s.context_tokens == 0 and sh.first_prompts:
        return max(1, rng.choice(sh.first_prompts))
    return max(1, s.context_tokens + rng.choice(sh.extras))


def start_budgeter(inputs: ForecastInputs, config: BudgeterConfig, t0: float) -> Budgeter:
    """The sidecar's budgeter as of ``t0``: the sessions in their states, admitted and arrived when the
    sidecar's were, with their contexts and budgets; in mode ``off`` (the turns in flight were forwarded
    under the current config; ``run_forecast`` sets ``config`` once they are in its engine)."""
    return Budgeter.from_dict(
        {
            "config": config.replace(mode="off").to_dict(),
            "pool_tokens": inputs.engine.kv_cache_size_tokens,
            "sessions": [
                {
                    "id": s.id,
                    "state": s.state,
                    "arrived_at": t0 - s.arrived_for_s,
                    "admitted_at": _admitted_at(s, t0),
                    "context_tokens": s.context_tokens,
                    "output_budget": s.output_budget or inputs.output_budget,  # as the sidecar counts it
                    "turns": s.turns_done,
                    "manual": s.manual,
                    "pinned": s.pinned,
                    "parked_since": t0 - s.parked_for_s if s.state == "parked" else None,
                    "last_activity": t0,
                }
                for s in inputs.sessions
            ],
        }
    )


def run_forecast(
    inputs: ForecastInputs,
    config: BudgeterConfig,
    minutes: float,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Simulate ``minutes`` under ``config``; returns ``{"summary": {...}, "series": {...}}`` (see the module doc)."""
    sh = inputs.shapes
    engine = Engine(inputs.engine, inputs.cost)
    pool_tokens = inputs.engine.kv_cache_size_tokens
    horizon = minutes * 60.0
    n_sec = max(1, int(math.ceil(horizon)))

    oldest_first = sorted(inputs.sessions, key=lambda s: (-s.since_activity_s, s.id))
    contents = {s.id: _content(sh.shared_prefix, s.id) for s in inputs.sessions}
    sessions: dict[str, _Sess] = {}
    in_flight: dict[str, int] = {}  # the prompt of each turn in flight, in the order it was forwarded
    for s in oldest_first:
        rng = random.Random(f"{seed}-now-{s.id}")
        sess = _Sess(
            s.id, contents[s.id], rng, s.context_tokens, _total_turns(rng, sh.session_turns, s.turns_done)
        )
        sess.budget = s.output_budget or inputs.output_budget
        sessions[s.id] = sess
        if s.in_flight:
            in_flight[s.id] = pending_prompt(s, rng, sh)
    # the engine's running batch: the turns in flight longest, oldest first, each answer that far along
    running = {sid: j for j, sid in enumerate(list(in_flight)[: inputs.engine_running])}
    batch = len(running)

    # warm-up: the admitted sessions' contexts prefilled once (the running batch: its whole prompts)
    warm = [
        s
        # the running batch last, its oldest last of all: a pool too small for the whole batch keeps the
        # turns the engine took first (decoding, where its youngest may still be prefilling)
        for s in sorted(oldest_first, key=lambda s: (s.id in running, -running.get(s.id, 0)))
        if s.state == "admitted" and (s.context_tokens > 0 or s.id in running)  # a first turn: its prompt
    ]
    warmed: dict[str, Request] = {}
    for s in warm:
        tokens = min(
            in_flight[s.id] if s.id in running else s.context_tokens, pool_tokens - inputs.engine.block_size
        )
        warmed[s.id] = Request(
            id=f"warm-{s.id}",
            content=contents[s.id],
            prompt_tokens=max(1, tokens),
            max_tokens=1,
            arrival=0.0,
            session=s.id,
        )
        engine.add_request(warmed[s.id])
    while engine.running or engine.waiting:
        engine.run_until(engine.now + 60.0)
    t0 = engine.now
    end = t0 + horizon

    budgeter = start_budgeter(inputs, config, t0)
    acc = _Acc(n_sec)
    parked: list[int] = []
    waiting: list[int] = []

    def forward(sess: _Sess, now: float, prompt: int) -> None:
        out = sess.rng.choice(sh.outputs) or 1
        if sess.id in running:  # the j-th oldest of K running: (j + 0.5) / K of its answer still to come
            left = max(1, min(out, round(out * (running.pop(sess.id) + 0.5) / batch)))
            sess.answered, out = out - left, left
            # what the engine found cached when it took the turn: its prompt's warm-up found it
            sess.found = (warmed[sess.id].cached_tokens or 0) if sess.id in warmed else None
        sess.forwarded_at = now
        engine.add_request(
            Request(
                id=f"{sess.id}-{sess.left}",
                content=sess.content,
                prompt_tokens=prompt,
                max_tokens=out,
                arrival=now,
                session=sess.id,
                tag=sess,
            )
        )

    def submit(now: float, sess: _Sess, prompt: int | None = None, gated_at: float | None = None) -> None:
        prompt = max(1, sess.context + sess.rng.choice(sh.extras)) if prompt is None else prompt
        sess.gated_at = now if gated_at is None else gated_at
        if budgeter.request_turn(sess.id, now, prompt, sess.budget) == "forward":
            forward(sess, now, prompt)
        else:
            sess.held = prompt

    def gap(sess: _Sess) -> float:
        return sess.rng.choice(sh.gaps)

    def on_finish(req: Request) -> None:
        done = req.finish_time or engine.now
        if inputs.turn_overhead_s > 0:  # the answer reaches the client that much later
            loop.push(done + inputs.turn_overhead_s, delivered, req)
        else:
            delivered(done, req)

    def delivered(now: float, req: Request) -> None:
        sess: _Sess = req.tag  # type: ignore[assignment]
        cached = req.cached_tokens if sess.found is None else sess.found  # a running turn: as it was taken
        sess.found = None
        if now <= t0 + horizon:
            acc.add(now - t0, req.prompt_tokens, min(cached or 0, req.prompt_tokens), now - sess.gated_at)
        output, sess.answered = req.output + sess.answered, 0
        budgeter.turn_finished(sess.id, now, req.prompt_tokens, output, latency_s=now - sess.forwarded_at)
        sess.context = req.prompt_tokens + output
        sess.left -= 1
        if sess.left <= 0 or now > end:  # nothing after the horizon is counted: no next turn
            budgeter.end_session(sess.id, now)
            del sessions[sess.id]
        else:
            loop.push(now + gap(sess), submit, sess)
        # as the sidecar does after every turn: the room it left goes to a queued session at once
        release(now)

    def arrive(now: float, i: int) -> None:
        sid = f"new-{i}"
        rng = random.Random(f"{seed}-new-{i}")
        sess = _Sess(
            sid,
            _content(sh.shared_prefix, sid),
            rng,
            0,
            max(1, rng.choice(sh.session_turns)) if sh.session_turns else 1,
        )
        sessions[sid] = sess
        sess.context = max(1, rng.choice(sh.first_prompts)) if sh.first_prompts else 1
        sess.budget = rng.choice(inputs.output_budgets) if inputs.output_budgets else inputs.output_budget
        sess.gated_at = now
        prompt = sess.context
        if budgeter.request_turn(sid, now, prompt, sess.budget) == "forward":
            forward(sess, now, prompt)
        else:
            sess.held = prompt

    def release(now: float) -> None:
        for sid in budgeter.release(now):
            sess = sessions.get(sid)
            if sess is not None and sess.held is not None:
                prompt, sess.held = sess.held, None
                forward(sess, now, prompt)

    def tick(now: float, second: int) -> None:
        release(now)
        counts = budgeter.counts()
        parked.append(counts["parked"])
        waiting.append(counts["waiting"])
        if progress is not None and second % 30 == 0:
            progress(second / n_sec)

    loop = EventLoop(engine, on_finish)
    for s in oldest_first:  # turns in flight reach the engine in the order they were forwarded
        sess = sessions[s.id]
        if s.id in in_flight:
            prompt = in_flight[s.id]
            budgeter.request_turn(s.id, t0, prompt, sess.budget)  # mode off: forwarded
            sess.gated_at = t0 - s.since_activity_s  # its latency counts from when it was forwarded
            loop.push(t0, lambda now, x: forward(x[0], now, x[1]), (sess, prompt))
        elif s.held:  # its turn is at the gate already (since its last activity): asked for at t = 0
            held = (sess, pending_prompt(s, sess.rng, sh), t0 - s.since_activity_s)
            loop.push(t0, lambda now, x: submit(now, *x), held)
        else:
            loop.push(t0 + gap(sess), submit, sess)
    budgeter.set_config(config)
    arr_rng = random.Random(f"{seed}-arrivals")
    t, i = 0.0, 0
    while sh.arrival_rate > 0 and sh.first_prompts:
        t += arr_rng.expovariate(sh.arrival_rate)
        if t >= horizon:
            break
        loop.push(t0 + t, arrive, i)
        i += 1
    for s in range(1, n_sec + 1):
        loop.push(t0 + s, tick, s)
    wall_s = loop.run()
    if progress is not None:
        progress(1.0)
    last = max(0, n_sec - 300)
    prompt, cached = sum(acc.prompt), sum(acc.cached)
    prompt5, cached5 = sum(acc.prompt[last:]), sum(acc.cached[last:])
    summary = {
        "mode": config.mode,
        "low": config.low,
        "high": config.high,
        "minutes": minutes,
        "seed": seed,
        "r_t": round(cached / prompt, 4) if prompt else None,
        "r_t_last_5min": round(cached5 / prompt5, 4) if prompt5 else None,
        "turns_per_s": round(sum(acc.turns) / horizon, 4) if horizon else None,
        "p95_turn_latency_s": None if not acc.latencies else round(_p95(acc.latencies) or 0.0, 3),
        "parked_mean": round(sum(parked) / len(parked), 2) if parked else 0.0,
        "parked_end": parked[-1] if parked else 0,
        "parked_max": max(parked, default=0),
        "parked_session_minutes": round(sum(parked) / 60.0, 1),
        "waiting_end": waiting[-1] if waiting else 0,
        "sessions_at_start": len(inputs.sessions),
        "sessions_arrived": i,
        "warmup_s": round(t0, 2),
        "wall_s": round(wall_s, 3),
    }
    return {
        "summary": summary,
        "series": {
            "turns": acc.turns,
            "prompt_tokens": acc.prompt,
            "cached_tokens": acc.cached,
            "parked": parked,
            "waiting": waiting,
        },
    }
