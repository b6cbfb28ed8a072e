"""Offline runs: workloads + the sidecar's gate + the engine, on a simulated clock, as fast as it goes.

A run is pure: ``run_scenario(...)`` takes a scenario, a control, a seed and
settings and returns plain data (per-second series and a summary); nothing
here reads a clock other than ``time.perf_counter`` for ``wall_s``.

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

import heapq
import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

from core.budgeter import Budgeter, BudgeterConfig
from core.runs import judge_run
from simulator.config import SimConfig, SimConfigError
from simulator.content import SegmentContent
from simulator.engine import Engine, Request

SCENARIOS = ("agent-steady", "agent-burst", "agent-flush", "rag-storm")
CONTROLS = ("off", "admission-only", "latency-park", "session-cap-park", "budgeter-park")


def scenario_config(name: str, base: SimConfig | None = None) -> SimConfig:
    """The preset of scenario ``name`` (``--set`` overrides are applied after)."""
    cfg = base or SimConfig()
    if name == "agent-steady":
        return replace(cfg, agent=replace(cfg.agent, burst_rate=0.0))
    if name == "agent-burst":
        # 30 extra sessions over 5 minutes (SIMULATOR.md's prototype: ~15, Poisson); see docs/simulator-results.md
        return replace(cfg, agent=replace(cfg.agent, burst_rate=0.1))
    if name == "agent-flush":
        return replace(cfg, agent=replace(cfg.agent, burst_rate=0.0, flush_at_min=10.0))
    if name == "rag-storm":
        return cfg
    raise SimConfigError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")


# ------------------------------------------------------------------ series
SERIES_FIELDS = ("t", "engine_hit_ratio", "token_weighted", "request_weighted", "turns_per_s",
                 "sessions_in_system", "parked", "waiting_sessions", "admitted", "kv_usage", "kv_resident",
                 "demand_tokens", "running", "waiting", "preemptions", "turns", "prompt_tokens", "cached_tokens",
                 "hit_turns", "engine_queries", "engine_hits",
                 # cumulative engine counters, as vLLM exports them (core.risk's engine-only inputs)
                 "engine_prompt_tokens", "engine_cached_tokens", "generation_tokens")


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


def run_agent(cfg: SimConfig, control: str, seed: int, minutes: float) -> dict[str, Any]:
    if control not in CONTROLS:
        raise SimConfigError(f"unknown control {control!r}; known: {', '.join(CONTROLS)}")
    a = cfg.agent
    ctl = cfg.control
    engine = Engine(cfg.engine, cfg.cost)
    horizon = minutes * 60.0
    n_sec = max(1, int(math.ceil(horizon)))
    pool_tokens = cfg.engine.kv_cache_size_tokens
    budget_cfg = BudgeterConfig(mode="off", low=ctl.low_band, high=ctl.high_band, session_cap=ctl.session_cap,
                                latency_limit_s=ctl.latency_limit_s, default_output_budget=a.output_budget)
    control_cfg = budget_cfg.replace(mode=control)
    budgeter = Budgeter(budget_cfg, pool_tokens=pool_tokens)
    control_at = ctl.control_start_min * 60.0
    switched = False

    # arrivals: base Poisson process plus the burst window's extra process
    arr_rng = random.Random(f"{seed}-arrivals")
    arrivals: list[float] = []
    t = 0.0
    while a.arrival_rate > 0:
        t += arr_rng.expovariate(a.arrival_rate)
        if t >= horizon:
            break
        arrivals.append(t)
    b0 = a.burst_start_min * 60.0
    b1 = b0 + a.burst_minutes * 60.0
    t = b0
    burst_rng = random.Random(f"{seed}-burst")
    if a.burst_process == "uniform" and a.burst_rate > 0:
        n_burst = int(round(a.burst_rate * (b1 - b0)))
        arrivals.extend(t for k in range(n_burst) if (t := b0 + (k + burst_rng.random()) / a.burst_rate) < horizon)
    while a.burst_rate > 0 and a.burst_process == "poisson":
        t += burst_rng.expovariate(a.burst_rate)
        if t >= min(b1, horizon):
            break
        arrivals.append(t)
    arrivals.sort()

    events: list[tuple[float, int, int, Any]] = []
    seq = 0
    ARRIVE, TURN, TICK, FLUSH = 0, 1, 2, 3

    def push(when: float, kind: int, data: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (when, seq, kind, data))

    for i, when in enumerate(arrivals):
        push(when, ARRIVE, i)
    for s in range(1, n_sec + 1):
        push(float(s), TICK, s)
    if a.flush_at_min >= 0 and a.flush_at_min * 60.0 < horizon:
        push(a.flush_at_min * 60.0, FLUSH, None)

    sessions: dict[str, _Session] = {}
    raw = _Raw(n_sec)
    series: dict[str, list[Any]] = {k: [] for k in SERIES_FIELDS}
    last_queries = 0
    last_hits = 0
    sys_label = "sys"
    prompt_of = [a.initial_context + k * a.context_growth for k in range(a.turns)]

    def forward(sess: _Session, now: float, prompt: int) -> None:
        req = Request(id=f"{sess.id}-t{sess.turn}", content=sess.content, prompt_tokens=prompt,
                      max_tokens=a.output_tokens, arrival=now, session=sess.id, tag=sess)
        sess.forwarded_at = now
        engine.add_request(req)

    def submit(sess: _Session, now: float) -> None:
        prompt = prompt_of[sess.turn]
        sess.submitted_at = now
        decision = budgeter.request_turn(sess.id, now, prompt, a.output_budget)
        if decision == "forward":
            forward(sess, now, prompt)
        else:
            sess.held = (now, prompt)

    def on_finish(req: Request) -> None:
        sess: _Session = req.tag  # type: ignore[assignment]
        now = req.finish_time or engine.now
        cached = min(req.cached_tokens or 0, req.prompt_tokens)
        raw.add(now, req.prompt_tokens, cached)
        budgeter.turn_finished(sess.id, now, req.prompt_tokens, req.output, latency_s=now - sess.forwarded_at)
        sess.turn += 1
        if sess.turn >= a.turns:
            budgeter.end_session(sess.id, now)
            del sessions[sess.id]
            return
        think = sess.rng.lognormvariate(0.0, a.tool_latency_sigma) * a.tool_latency_mean / math.exp(
            a.tool_latency_sigma ** 2 / 2)
        push(now + think, TURN, sess)

    wall0 = time.perf_counter()
    while events:
        when = events[0][0]
        finished = engine.run_until(when)
        if finished:
            for req in finished:
                on_finish(req)
            continue
        when, _, kind, data = heapq.heappop(events)
        if kind == TURN:
            submit(data, when)
        elif kind == ARRIVE:
            sid = f"s{data}"
            sess = _Session(sid, SegmentContent([(sys_label, a.system_prompt_tokens),
                                                 (("s", sid), 1 << 40)]),
                            random.Random(f"{seed}-session-{data}"))
            sessions[sid] = sess
            submit(sess, when)
        elif kind == FLUSH:
            engine.flush()
        elif kind == TICK:
            if not switched and when >= control_at:
                budgeter.set_config(control_cfg)
                switched = True
            for sid in budgeter.release(when):
                sess = sessions.get(sid)
                if sess is not None and sess.held is not None:
                    _, prompt = sess.held
                    sess.held = None
                    forward(sess, when, prompt)
            counts = budgeter.counts()
            st = engine.stats
            series["t"].append(int(data))
            series["sessions_in_system"].append(len(sessions))
            series["parked"].append(counts["parked"])
            series["waiting_sessions"].append(counts["waiting"])
            series["admitted"].append(counts["admitted"])
            series["kv_usage"].append(round(engine.kv_usage, 4))
            pool = engine.pool
            series["kv_resident"].append(round(1 - (pool.num_free() - pool.num_cached_free()) / pool.num_blocks, 4))
            series["demand_tokens"].append(budgeter.demand_tokens())
            series["running"].append(len(engine.running))
            series["waiting"].append(len(engine.waiting))
            series["preemptions"].append(st.preemptions)
            series["engine_queries"].append(st.prefix_queries - last_queries)
            series["engine_hits"].append(st.prefix_hits - last_hits)
            last_queries, last_hits = st.prefix_queries, st.prefix_hits
            series["engine_prompt_tokens"].append(st.prompt_tokens)
            series["engine_cached_tokens"].append(st.prompt_cached + st.prompt_offloaded)
            series["generation_tokens"].append(st.generation_tokens)
    wall_s = time.perf_counter() - wall0
    series["turns"] = raw.turns
    series["prompt_tokens"] = raw.prompt
    series["cached_tokens"] = raw.cached
    series["hit_turns"] = raw.hit_turns
    window = 60
    series["token_weighted"] = _ratio(_trailing(raw.cached, window), _trailing(raw.prompt, window))
    series["request_weighted"] = _ratio(_trailing(raw.hit_turns, window), _trailing(raw.turns, window))
    series["engine_hit_ratio"] = _ratio(_trailing(series["engine_hits"], window),
                                        _trailing(series["engine_queries"], window))
    series["turns_per_s"] = [round(v / window, 4) for v in _trailing(raw.turns, window)]
    verdict = judge_run(raw.prompt, raw.cached, raw.turns, series["sessions_in_system"],
                        control_start_min=ctl.control_start_min, minutes=minutes)
    summary = verdict.as_dict()
    st = engine.stats
    summary.update({
        "wall_s": round(wall_s, 4),
        "sim_minutes_per_wall_s": round(minutes / wall_s, 1) if wall_s > 0 else None,
        "offered_turns_per_s": round((a.arrival_rate + a.burst_rate * a.burst_minutes * 60 / horizon) * a.turns, 4),
        "steady_offered_turns_per_s": round(a.arrival_rate * a.turns, 4),  # the load offered after the burst
        "engine_steps": st.steps,
        "preemptions": st.preemptions,
        "evicted_blocks": engine.pool.evictions(),
        "engine_hit_ratio_total": round(st.prefix_hits / st.prefix_queries, 4) if st.prefix_queries else None,
        "sessions_arrived": len(arrivals),
    })
    return {"series": series, "summary": summary}


def run_scenario(scenario: str, control: str, seed: int, minutes: float,
                 overrides: dict[str, Any] | None = None, exact: bool = False) -> dict[str, Any]:
    """One offline run; returns ``{"scenario", "control", "seed", "minutes", "config", "series", "summary"}``."""
    from simulator.config import apply_overrides

    cfg = scenario_config(scenario)
    cfg = apply_overrides(cfg, dict(overrides or {}))
    if exact:
        cfg = replace(cfg, engine=replace(cfg.engine, mode="exact"))
    if scenario == "rag-storm":
        from simulator.rag import run_rag

        result = run_rag(cfg, seed, minutes)
    else:
        result = run_agent(cfg, control, seed, minutes)
    return {"scenario": scenario, "control": control, "seed": seed, "minutes": minutes,
            "mode": cfg.engine.mode, "config": cfg.to_dict(), **result}
