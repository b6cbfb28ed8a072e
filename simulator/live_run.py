"""``python -m simulator live-run``: the simulator's agent workloads against a real engine, in wall-clock time.

Drives any OpenAI-compatible engine *through the sidecar* with the same
closed-loop agent sessions as ``simulator run`` (scenario presets and ``--set``
keys of simulator/config.py; the same seeded arrival and tool-latency streams,
so a seed offers the same sessions here and offline), switches the sidecar's
control through its authenticated control API at ``--control-start-min``, and
writes ``run.json`` with the series and summary fields of ``simulator run``,
judged by the same ``core.runs.judge_run``.

Token sizes: prompts are built from filler words that the project's tiny model
tokenizes as one token each (``simulator.content.WORDS``); the turn's real
prompt size is what the engine reports in ``usage`` and that is what is
recorded. Turn k's messages are the whole previous turn, the model's answer,
and ``context_growth - output_tokens`` new words, like the simulator's session.
Each run starts its texts with a random nonce, so nothing cached by an earlier
run (same seed, same texts) is hit. Answers are ``output_tokens`` long
(``ignore_eos``, a vLLM/SGLang sampling extra; ``--no-ignore-eos`` for engines
that reject it).

Series the real engine cannot give are ``null``: ``kv_resident`` (vLLM has no
gauge of cached-but-free blocks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import secrets
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from core.runs import judge_run, window_ratio
from simulator.agent import CONTROLS, SERIES_FIELDS
from simulator.config import AgentWorkload, SimConfig, SimConfigError, apply_overrides, parse_set_args
from simulator.content import words
from simulator.offline import scenario_config

log = logging.getLogger("simulator.live_run")
LIVE_SCENARIOS = ("agent-steady", "agent-burst")
LIVE_CONTROLS = ("off", "budgeter-park")
WINDOW_S = 60


def arrival_times(a: AgentWorkload, seed: int, horizon: float) -> list[float]:
    """Session arrival times, drawn exactly as ``simulator run`` draws them (simulator/agent.py ``run_agent``)."""
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
    burst_rng = random.Random(f"{seed}-burst")
    if a.burst_process == "uniform" and a.burst_rate > 0:
        n_burst = int(round(a.burst_rate * (b1 - b0)))
        arrivals.extend(t for k in range(n_burst) if (t := b0 + (k + burst_rng.random()) / a.burst_rate) < horizon)
    t = b0
    while a.burst_rate > 0 and a.burst_process == "poisson":
        t += burst_rng.expovariate(a.burst_rate)
        if t >= min(b1, horizon):
            break
        arrivals.append(t)
    return sorted(arrivals)


def tool_latency(rng: random.Random, a: AgentWorkload) -> float:
    """One tool latency, drawn as the simulator draws it (lognormal with mean ``tool_latency_mean``)."""
    return rng.lognormvariate(0.0, a.tool_latency_sigma) * a.tool_latency_mean / math.exp(
        a.tool_latency_sigma ** 2 / 2)


def filler(rng: random.Random, n: int) -> str:
    return words(rng, max(1, n))


@dataclass
class Recorder:
    """Per-second raw counts; index s covers wall time (s, s + 1] since the run started."""

    n: int
    turns: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    hit_turns: list[int] = field(default_factory=list)
    errors: int = 0
    retries: int = 0

    def __post_init__(self) -> None:
        self.turns, self.prompt, self.cached, self.hit_turns = ([0] * self.n for _ in range(4))

    def add(self, t: float, prompt: int, cached: int) -> None:
        if t > self.n:
            return
        s = min(self.n - 1, max(0, math.ceil(t) - 1))
        self.turns[s] += 1
        self.prompt[s] += prompt
        self.cached[s] += cached
        self.hit_turns[s] += cached > 0


@dataclass
class LiveRun:
    engine: str
    sidecar: str
    scenario: str
    control: str
    control_start_min: float
    minutes: float
    seed: int
    cfg: SimConfig
    token: str | None
    model: str | None = None
    ignore_eos: bool = True
    judge_window_min: float = 1.0
    nonce: str = field(default_factory=lambda: secrets.token_hex(4))

    def __post_init__(self) -> None:
        self.t0 = 0.0
        self.n_sec = max(1, int(math.ceil(self.minutes * 60)))
        self.rec = Recorder(self.n_sec)
        self.in_system: set[str] = set()
        self.open_sessions: set[str] = set()
        self.series: dict[str, list[Any]] = {k: [] for k in SERIES_FIELDS}
        self.switched = False
        self.first_engine: Any = None
        self.last_engine: Any = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    # ------------------------------------------------------------ control
    async def set_mode(self, client: httpx.AsyncClient, mode: str) -> None:
        c = self.cfg.control
        body = {"mode": mode, "low": c.low_band, "high": c.high_band}
        r = await client.put(f"{self.sidecar}/control/budgeter", json=body, timeout=30,
                             headers={"Authorization": f"Bearer {self.token}", "X-Actor": "live-run"})
        if r.status_code != 200:
            raise RuntimeError(f"the sidecar at {self.sidecar} refused control {body}: HTTP {r.status_code} "
                               f"{r.text[:300]} (is PREFIXOPS_OPERATOR_TOKEN / --operator-token its token?)")
        log.info("t=%.0fs sidecar control set to %s (bands %.2f/%.2f)", self.now(), mode, c.low_band, c.high_band)

    # ------------------------------------------------------------ sessions
    async def session(self, client: httpx.AsyncClient, index: int, arrive: float, system: str) -> None:
        a = self.cfg.agent
        await asyncio.sleep(max(0.0, arrive - self.now()))
        sid = f"lr-{self.nonce}-s{index}"
        rng = random.Random(f"{self.seed}-session-{index}")
        text_rng = random.Random(f"{self.seed}-text-{index}")
        self.in_system.add(sid)
        self.open_sessions.add(sid)
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": filler(text_rng, a.initial_context - a.system_prompt_tokens)}]
        try:
            for turn in range(a.turns):
                headers = {"X-Session-Id": sid}
                if turn == a.turns - 1:
                    headers["X-Session-End"] = "true"
                body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": a.output_tokens}
                if self.ignore_eos:
                    body["ignore_eos"] = True
                answer = await self.turn(client, body, headers)
                if answer is None:
                    return
                if turn == a.turns - 1:
                    self.open_sessions.discard(sid)
                    return
                messages.append({"role": "assistant", "content": answer})
                messages.append({"role": "user", "content": filler(text_rng, a.context_growth - a.output_tokens)})
                await asyncio.sleep(tool_latency(rng, a))
        finally:
            self.in_system.discard(sid)

    async def turn(self, client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> str | None:
        for attempt in range(50):
            try:
                r = await client.post(f"{self.sidecar}/v1/chat/completions", json=body, headers=headers,
                                      timeout=httpx.Timeout(900, connect=10))
            except httpx.HTTPError as exc:
                self.rec.errors += 1
                log.warning("turn failed (%s: %s); retrying", type(exc).__name__, exc)
                await asyncio.sleep(min(10, 1 + attempt))
                continue
            if r.status_code == 200:
                data = r.json()
                usage = data.get("usage") or {}
                details = usage.get("prompt_tokens_details") or {}
                self.rec.add(self.now(), int(usage.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0))
                return str(data["choices"][0]["message"]["content"] or "")
            if r.status_code in (429, 503):  # held too long at the sidecar: the session keeps its place
                self.rec.retries += 1
                await asyncio.sleep(float(r.headers.get("Retry-After", "2") or 2))
                continue
            self.rec.errors += 1
            log.warning("turn answered HTTP %s: %s", r.status_code, r.text[:200])
            await asyncio.sleep(min(10, 1 + attempt))
        return None

    # ------------------------------------------------------------ sampling
    async def sample(self, client: httpx.AsyncClient, second: int) -> None:
        from core.engine_metrics import parse_engine_metrics

        s = self.series
        try:
            state = (await client.get(f"{self.sidecar}/state", timeout=5)).json()
            backlog, budgeter = state["backlog"], state["budgeter"]
        except (httpx.HTTPError, ValueError, KeyError):
            backlog, budgeter = {}, {}
        try:
            snap = parse_engine_metrics((await client.get(f"{self.engine}/metrics", timeout=5)).text).total()
        except Exception:  # noqa: BLE001 - a missed sample is recorded as a gap, the run goes on
            snap = None
        prev = self.last_engine
        s["t"].append(second)
        s["sessions_in_system"].append(len(self.in_system))
        s["parked"].append(backlog.get("parked", 0))
        s["waiting_sessions"].append(backlog.get("waiting", 0))
        s["admitted"].append(backlog.get("admitted", 0))
        s["demand_tokens"].append(budgeter.get("demand_tokens", 0))
        s["projected_demand_tokens"].append(budgeter.get("projected_demand_tokens"))
        s["kv_usage"].append(None if snap is None else snap.kv_usage)
        s["kv_resident"].append(None)
        s["running"].append(None if snap is None else snap.requests_running)
        s["waiting"].append(None if snap is None else snap.requests_waiting)
        if snap is not None and self.first_engine is None:
            self.first_engine = snap
        s["preemptions"].append(None if snap is None or self.first_engine is None
                                else (snap.preemptions or 0) - (self.first_engine.preemptions or 0))
        dq = dh = 0.0
        if snap is not None and prev is not None:
            dq = max(0.0, (snap.prefix_cache_queries or 0) - (prev.prefix_cache_queries or 0))
            dh = max(0.0, (snap.prefix_cache_hits or 0) - (prev.prefix_cache_hits or 0))
        s["engine_queries"].append(dq)
        s["engine_hits"].append(dh)
        if snap is not None:
            self.last_engine = snap

    async def sampler(self, client: httpx.AsyncClient) -> None:
        control_at = self.control_start_min * 60.0
        for second in range(1, self.n_sec + 1):
            await asyncio.sleep(max(0.0, second - self.now()))
            if not self.switched and self.now() >= control_at:
                self.switched = True
                if self.control != "off":
                    await self.set_mode(client, self.control)
            await self.sample(client, second)
            if second % 30 == 0:
                tw = window_ratio(self.rec.cached, self.rec.prompt, second - 60, second)
                log.info("t=%ds sessions=%d parked=%s R_t(60s)=%s turns(60s)=%d preemptions=%s", second,
                         len(self.in_system), self.series["parked"][-1],
                         None if tw is None else round(tw, 3), sum(self.rec.turns[max(0, second - 60):second]),
                         self.series["preemptions"][-1])

    # ------------------------------------------------------------ run
    async def run(self) -> dict[str, Any]:
        a = self.cfg.agent
        horizon = self.minutes * 60.0
        arrivals = arrival_times(a, self.seed, horizon)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits) as client:
            if self.model is None:
                models = (await client.get(f"{self.sidecar}/v1/models", timeout=30)).json()
                self.model = models["data"][0]["id"]
            pool = (await client.get(f"{self.sidecar}/state", timeout=30)).json()["budgeter"].get("pool_tokens")
            self.t0 = time.monotonic()
            await self.set_mode(client, "off")
            system = f"run {self.nonce} " + filler(random.Random(f"{self.seed}-system"), a.system_prompt_tokens - 3)
            self.t0 = time.monotonic()
            wall0 = time.perf_counter()
            tasks = [asyncio.create_task(self.session(client, i, t, system)) for i, t in enumerate(arrivals)]
            await self.sampler(client)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            wall_s = time.perf_counter() - wall0
            for sid in sorted(self.open_sessions):  # end what the run left behind, so the next run starts clean
                with contextlib.suppress(httpx.HTTPError):
                    await client.delete(f"{self.sidecar}/sessions/{sid}", timeout=10,
                                        headers={"Authorization": f"Bearer {self.token}", "X-Actor": "live-run"})
        return self.result(arrivals, wall_s, pool)

    def result(self, arrivals: list[float], wall_s: float, pool: int | None) -> dict[str, Any]:
        a = self.cfg.agent
        s = self.series
        rec = self.rec
        s["turns"], s["prompt_tokens"], s["cached_tokens"], s["hit_turns"] = (rec.turns, rec.prompt, rec.cached,
                                                                             rec.hit_turns)
        s["token_weighted"] = _ratio(_trailing(rec.cached), _trailing(rec.prompt))
        s["request_weighted"] = _ratio(_trailing(rec.hit_turns), _trailing(rec.turns))
        s["engine_hit_ratio"] = _ratio(_trailing(s["engine_hits"]), _trailing(s["engine_queries"]))
        s["turns_per_s"] = [round(v / WINDOW_S, 4) for v in _trailing(rec.turns)]
        verdict = judge_run(rec.prompt, rec.cached, rec.turns, s["sessions_in_system"],
                            control_start_min=self.control_start_min, minutes=self.minutes,
                            window_min=self.judge_window_min)
        summary = verdict.as_dict()
        horizon = self.minutes * 60.0
        q = sum(s["engine_queries"])
        summary.update({
            "wall_s": round(wall_s, 1),
            "offered_turns_per_s": round((a.arrival_rate + a.burst_rate * a.burst_minutes * 60 / horizon) * a.turns, 4),
            "steady_offered_turns_per_s": round(a.arrival_rate * a.turns, 4),
            "preemptions": s["preemptions"][-1] if s["preemptions"] else None,
            "engine_hit_ratio_total": round(sum(s["engine_hits"]) / q, 4) if q else None,
            "sessions_arrived": len(arrivals),
            "judge_window_min": self.judge_window_min,
            "turn_errors": rec.errors,
            "held_503_retries": rec.retries,
            "phases": phases(rec, a, self.control_start_min, self.minutes, s["preemptions"]),
        })
        cfg = self.cfg.to_dict()
        cfg["control"]["control_start_min"] = self.control_start_min
        if pool:
            cfg["engine"]["pool_tokens"] = pool
        return {"scenario": self.scenario, "control": self.control, "seed": self.seed, "minutes": self.minutes,
                "mode": "live", "engine_url": self.engine, "sidecar_url": self.sidecar, "model": self.model,
                "config": cfg, "arrivals": [round(t, 3) for t in arrivals], "series": s, "summary": summary}


def phases(rec: Recorder, a: AgentWorkload, control_start_min: float, minutes: float,
           preemptions: list[Any]) -> dict[str, dict[str, Any]]:
    """R_t, turns/s and engine preemptions before the burst, between the burst and the control, and at the end."""
    b0 = a.burst_start_min * 60.0
    b1 = b0 + a.burst_minutes * 60.0
    c = control_start_min * 60.0
    end = minutes * 60.0
    spans = {"before": (0.0, min(b0, end)), "during": (b1, c) if c > b1 else (b0, min(b1, end)),
             "after": (max(c, end - 120.0), end)}
    out: dict[str, dict[str, Any]] = {}
    for name, (lo, hi) in spans.items():
        if hi <= lo:
            continue
        tw = window_ratio(rec.cached, rec.prompt, lo, hi)
        turns = sum(rec.turns[int(lo):int(hi)])

        def at(t: float) -> Any:
            i = min(len(preemptions) - 1, max(0, int(t) - 1))
            return preemptions[i] if preemptions else None

        p_lo, p_hi = at(lo), at(hi)
        out[name] = {"from_s": lo, "to_s": hi, "token_weighted": None if tw is None else round(tw, 4),
                     "turns_per_s": round(turns / (hi - lo), 4),
                     "preemptions": None if p_lo is None or p_hi is None else p_hi - p_lo}
    return out


def _trailing(values: list[float], window: int = WINDOW_S) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v or 0
        if i >= window:
            acc -= values[i - window] or 0
        out.append(acc)
    return out


def _ratio(num: list[float], den: list[float]) -> list[float | None]:
    return [None if d <= 0 else round(n / d, 4) for n, d in zip(num, den, strict=True)]


# ------------------------------------------------------------------ command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine base URL (its /metrics is sampled every second)")
    p.add_argument("--sidecar", required=True, help="sidecar base URL in front of that engine (traffic goes here)")
    p.add_argument("--scenario", required=True, choices=LIVE_SCENARIOS)
    p.add_argument("--control", default="off", choices=LIVE_CONTROLS)
    p.add_argument("--control-start-min", type=float, required=True,
                   help="wall-clock minute at which the sidecar's control switches from off to --control")
    p.add_argument("--minutes", type=float, required=True, help="wall-clock minutes to run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--operator-token", default=None, help="sidecar operator token (default $PREFIXOPS_OPERATOR_TOKEN)")
    p.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (engines that reject it)")
    p.add_argument("--judge-window-min", type=float, default=1.0,
                   help="core.runs window for degraded/recovered (the offline runs use 5 of 90 simulated "
                        "minutes; a run of a few wall minutes uses 1)")
    p.add_argument("--preset", default=None, help="a named set of --set values (see simulator/fit.py PRESETS)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="workload or control setting (the simulator's keys; repeatable)")


def live_run_command(args: argparse.Namespace) -> int:
    from simulator.fit import preset_overrides
    from simulator.plots import plot_run

    token = args.operator_token or os.environ.get("PREFIXOPS_OPERATOR_TOKEN")
    if not token:
        print("error: the sidecar's operator token is needed to switch its control: --operator-token or "
              "PREFIXOPS_OPERATOR_TOKEN", file=sys.stderr)
        return 2
    if not 0 <= args.control_start_min <= args.minutes:
        print(f"error: --control-start-min must be within the run (0..{args.minutes:g}), got "
              f"{args.control_start_min:g}", file=sys.stderr)
        return 2
    try:
        overrides = {**preset_overrides(args.preset, args.scenario), **parse_set_args(args.set)}
        cfg = apply_overrides(scenario_config(args.scenario), overrides)
        cfg = replace(cfg, control=replace(cfg.control, control_start_min=args.control_start_min))
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    assert args.control in CONTROLS
    run = LiveRun(engine=args.engine.rstrip("/"), sidecar=args.sidecar.rstrip("/"), scenario=args.scenario,
                  control=args.control, control_start_min=args.control_start_min, minutes=args.minutes,
                  seed=args.seed, cfg=cfg, token=token, model=args.model, ignore_eos=not args.no_ignore_eos,
                  judge_window_min=args.judge_window_min)
    try:
        result = asyncio.run(run.run())
    except (httpx.HTTPError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    result["overrides"] = overrides
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    plottable = json.loads(json.dumps(result))
    plottable["series"]["kv_resident"] = [float("nan")] * len(plottable["series"]["t"])
    for key in ("kv_usage", "running"):
        plottable["series"][key] = [float("nan") if v is None else v for v in plottable["series"][key]]
    plot_run(plottable, out / "run.png")
    sm = result["summary"]
    print(f"live {args.scenario} control={args.control} seed={args.seed} minutes={args.minutes:g} "
          f"collapsed={sm['collapsed']} recovered={sm['recovered']} minutes_to_recover={sm['minutes_to_recover']} "
          f"end_hit_ratio={sm['end_hit_ratio']} end_turns_per_s={sm['end_turns_per_s']} "
          f"preemptions={sm['preemptions']} sessions_arrived={sm['sessions_arrived']} wall_s={sm['wall_s']} "
          f"phases={json.dumps(sm['phases'])}")
    return 0
