"""The agent model: closed-loop agent sessions through the sidecar's gate into the engine.

A run is pure: ``run_agent(cfg, control, seed, minutes)`` returns plain data
(per-second series and a summary). Scenarios and their presets are in
``simulator.offline``; plots and the experiment harnesses are elsewhere
(``simulator.plots``, ``simulator.experiments``).

The sidecar is modelled as a gate in front of the engine running the project's
own ``core.budgeter.Budgeter`` (no second copy of any policy): every agent turn
goes through ``request_turn``; held turns wait at the gate; ``release`` runs every
simulated second. Before ``control_start_min`` the budgeter runs in mode
``off``; at ``control_start_min`` it switches to the chosen control. The KV pool
it budgets against is the engine's ``kv_cache_size_tokens``, as the sidecar reads
it from ``vllm:cache_config_info``.

Random streams are split per purpose (arrivals; each session's tool latencies),
so the same seed offers the same sessions to every control.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from core.budgeter import PARKED, Budgeter, BudgeterConfig
from core.risk import RiskSettings
from core.runs import judge_run
from simulator.config import SimConfig, SimConfigError
from simulator.content import SegmentContent
from simulator.engine import Engine, Request
from simulator.live_workload import arrival_times
from simulator.loop import EventLoop
from simulator.truth import Watch

PROJECTION_HORIZON_S = RiskSettings().projection_horizon_s
CONTROLS = ("off", "admission-only", "latency-park", "session-cap-park", "budgeter-park")


# ------------------------------------------------------------------ series
SERIES_FIELDS = (
    "t",
    "engine_hit_ratio",
    "token_weighted",
    "request_weighted",
    "turns_per_s",
    "sessions_in_system",
    "parked",
    "waiting_sessions",
    "admitted",
    "kv_usage",
    "kv_resident",
    "demand_tokens",
    "projected_demand_tokens",  # core.projection over core.risk's horizon, as the sidecar reports it
    "running",
    "waiting",
    "preemptions",
    "turns",
    "prompt_tokens",
    "cached_tokens",
    "hit_turns",
    "engine_queries",
    "engine_hits",
    # cumulative engine counters, as vLLM exports them (core.risk's engine-only inputs)
    "engine_prompt_tokens",
    "engine_cached_tokens",
    "generation_tokens",
)


@dataclass
class _Raw:
    """Per-second raw counts (index s covers simulated time (s, s+1])."""

    n: int
    turns: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    hit_turns: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.turns = [0] * self.n
        self.prompt = [0] * self.n
        self.cached = [0] * self.n
        self.hit_turns = [0] * self.n

    def add(self, t: float, prompt: int, cached: int) -> None:
        s = min(self.n - 1, max(0, math.ceil(t) - 1))
        self.turns[s] += 1
        self.prompt[s] += prompt
        self.cached[s] += cached
        self.hit_turns[s] += cached > 0


def _trailing(values: list[float], window: int) -> list[float]:
    out = []
    acc = 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc)
    return out


def _ratio(num: list[float], den: list[float]) -> list[float | None]:
    return [None if d <= 0 else round(n / d, 4) for n, d in zip(num, den, strict=True)]


# ------------------------------------------------------------------ agent runs
@dataclass(eq=False)
class _Session:
    id: str
    content: SegmentContent
    rng: random.Random
    turn: int = 0
    held: tuple[float, int] | None = None  # (arrival at the gate, prompt tokens)
    submitted_at: float = 0.0
    forwarded_at: float = 0.0
    parked_hold: bool = False  # the held turn waits because the session was parked


def _watch_agent(watch: Watch, budgeter: Budgeter, pool_tokens: int) -> None:
    """An eviction's cause: its owning session parked, else demand above the pool, else other."""

    def classify(label: Any) -> str:
        owner = label[1] if isinstance(label, tuple) and label[0] == "s" else None
        if owner in budgeter and budgeter.session(owner).state == PARKED:
            return "parked"
        return "pressure" if budgeter.demand_tokens() > pool_tokens else "other"

    watch.classify = classify
    watch.group = lambda req: req.session


def run_agent(
    cfg: SimConfig, control: str, seed: int, minutes: float, watch: Watch | None = None
) -> dict[str, Any]:
    """``watch``: record the turn trace and why each missing block was missing (``simulator.truth``)."""
    if control not in CONTROLS:
        raise SimConfigError(f"unknown control {control!r}; known: {', '.join(CONTROLS)}")
    a = cfg.agent
    ctl = cfg.control
    engine = Engine(cfg.engine, cfg.cost)
    horizon = minutes * 60.0
    n_sec = max(1, int(math.ceil(horizon)))
    pool_tokens = cfg.engine.kv_cache_size_tokens
    budget_cfg = BudgeterConfig(
        mode="off",
        low=ctl.low_band,
        high=ctl.high_band,
        session_cap=ctl.session_cap,
        latency_limit_s=ctl.latency_limit_s,
        default_output_budget=a.output_budget,
    )
    control_cfg = budget_cfg.replace(mode=control)
    budgeter = Budgeter(budget_cfg, pool_tokens=pool_tokens)
    control_at = ctl.control_start_min * 60.0
    switched = False
    if watch is not None:
        engine.set_watch(watch)
        _watch_agent(watch, budgeter, pool_tokens)

    # arrivals: base Poisson process plus the burst window's extra process (shared with live-run)
    arrivals = arrival_times(a, seed, horizon)

    sessions: dict[str, _Session] = {}
    raw = _Raw(n_sec)
    series: dict[str, list[Any]] = {k: [] for k in SERIES_FIELDS}
    last_queries = 0
    last_hits = 0
    sys_label = "sys"
    prompt_of = [a.initial_context + k * a.context_growth for k in range(a.turns)]

    def forward(sess: _Session, now: float, prompt: int) -> None:
        req = Request(
            id=f"{sess.id}-t{sess.turn}",
            content=sess.content,
            prompt_tokens=prompt,
            max_tokens=a.output_tokens,
            arrival=now,
            session=sess.id,
            tag=sess,
        )
        sess.forwarded_at = now
        engine.add_request(req)

    def submit(now: float, sess: _Session) -> None:
        prompt = prompt_of[sess.turn]
        sess.submitted_at = now
        decision = budgeter.request_turn(sess.id, now, prompt, a.output_budget)
        if decision == "forward":
            forward(sess, now, prompt)
        else:
            sess.held = (now, prompt)
            sess.parked_hold = watch is not None and budgeter.session(sess.id).state == PARKED

    def on_finish(req: Request) -> None:
        sess: _Session = req.tag  # type: ignore[assignment]
        now = req.finish_time or engine.now
        cached = min(req.cached_tokens or 0, req.prompt_tokens)
        raw.add(now, req.prompt_tokens, cached)
        budgeter.turn_finished(sess.id, now, req.prompt_tokens, req.output, latency_s=now - sess.forwarded_at)
        if watch is not None:
            held = sess.forwarded_at - sess.submitted_at
            watch.turn(
                req, now, sess.id, None, held, held if sess.parked_hold else 0.0, now - sess.forwarded_at
            )
            sess.parked_hold = False
        sess.turn += 1
        if sess.turn >= a.turns:
            budgeter.end_session(sess.id, now)
            del sessions[sess.id]
            return
        think = (
            sess.rng.lognormvariate(0.0, a.tool_latency_sigma)
            * a.tool_latency_mean
            / math.exp(a.tool_latency_sigma**2 / 2)
        )
        loop.push(now + think, submit, sess)

    def arrive(now: float, i: int) -> None:
        sid = f"s{i}"
        sess = _Session(
            sid,
            SegmentContent([(sys_label, a.system_prompt_tokens), (("s", sid), 1 << 40)]),
            random.Random(f"{seed}-session-{i}"),
        )
        sessions[sid] = sess
        submit(now, sess)

    def flush(now: float, _: Any) -> None:
        engine.flush()

    def tick(now: float, second: int) -> None:
        nonlocal switched, last_queries, last_hits
        if not switched and now >= control_at:
            budgeter.set_config(control_cfg)
            switched = True
        for sid in budgeter.release(now):
            sess = sessions.get(sid)
            if sess is not None and sess.held is not None:
                _, prompt = sess.held
                sess.held = None
                forward(sess, now, prompt)
        counts = budgeter.counts()
        st = engine.stats
        series["t"].append(second)
        series["sessions_in_system"].append(len(sessions))
        series["parked"].append(counts["parked"])
        series["waiting_sessions"].append(counts["waiting"])
        series["admitted"].append(counts["admitted"])
        series["kv_usage"].append(round(engine.kv_usage, 4))
        pool = engine.pool
        series["kv_resident"].append(
            round(1 - (pool.num_free() - pool.num_cached_free()) / pool.num_blocks, 4)
        )
        series["demand_tokens"].append(budgeter.demand_tokens())
        recent = sum(raw.turns[max(0, second - 60) : second]) / 60.0  # turns/s, as the sidecar's 60-s window
        series["projected_demand_tokens"].append(
            budgeter.projected_demand_tokens(now, PROJECTION_HORIZON_S, recent)
        )
        if watch is not None:
            watch.sample(now, budgeter.demand_tokens() / pool_tokens)
        series["running"].append(len(engine.running))
        series["waiting"].append(len(engine.waiting))
        series["preemptions"].append(st.preemptions)
        series["engine_queries"].append(st.prefix_queries - last_queries)
        series["engine_hits"].append(st.prefix_hits - last_hits)
        last_queries, last_hits = st.prefix_queries, st.prefix_hits
        series["engine_prompt_tokens"].append(st.prompt_tokens)
        series["engine_cached_tokens"].append(st.prompt_cached + st.prompt_offloaded)
        series["generation_tokens"].append(st.generation_tokens)

    loop = EventLoop(engine, on_finish)
    for i, when in enumerate(arrivals):
        loop.push(when, arrive, i)
    loop.every_second(n_sec, tick)
    if a.flush_at_min >= 0 and a.flush_at_min * 60.0 < horizon:
        loop.push(a.flush_at_min * 60.0, flush)
    wall_s = loop.run()
    series["turns"] = raw.turns
    series["prompt_tokens"] = raw.prompt
    series["cached_tokens"] = raw.cached
    series["hit_turns"] = raw.hit_turns
    window = 60
    series["token_weighted"] = _ratio(_trailing(raw.cached, window), _trailing(raw.prompt, window))
    series["request_weighted"] = _ratio(_trailing(raw.hit_turns, window), _trailing(raw.turns, window))
    series["engine_hit_ratio"] = _ratio(
        _trailing(series["engine_hits"], window), _trailing(series["engine_queries"], window)
    )
    series["turns_per_s"] = [round(v / window, 4) for v in _trailing(raw.turns, window)]
    verdict = judge_run(
        raw.prompt,
        raw.cached,
        raw.turns,
        series["sessions_in_system"],
        control_start_min=ctl.control_start_min,
        minutes=minutes,
    )
    summary = verdict.as_dict()
    st = engine.stats
    summary.update(
        {
            "wall_s": round(wall_s, 4),
            "sim_minutes_per_wall_s": round(minutes / wall_s, 1) if wall_s > 0 else None,
            "offered_turns_per_s": round(
                (a.arrival_rate + a.burst_rate * a.burst_minutes * 60 / horizon) * a.turns, 4
            ),
            "steady_offered_turns_per_s": round(
                a.arrival_rate * a.turns, 4
            ),  # the load offered after the burst
            "engine_steps": st.steps,
            "preemptions": st.preemptions,
            "evicted_blocks": engine.pool.evictions(),
            "engine_hit_ratio_total": round(st.prefix_hits / st.prefix_queries, 4)
            if st.prefix_queries
            else None,
            "sessions_arrived": len(arrivals),
        }
    )
    return {"series": series, "summary": summary}
