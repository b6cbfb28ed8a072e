"""The wall-clock driver of ``simulator live-run`` (the command and the method are in simulator/live_run.py).

`LiveRun` starts each session at its arrival time, plays its turns through the sidecar, switches the
sidecar's control at ``control_start_min``, samples the sidecar's ``/state`` and the engine's
``/metrics`` every second (`simulator.live_record`), and returns the ``run.json`` document judged by
`core.runs.judge_run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from core.engine_metrics import parse_engine_metrics
from core.runs import judge_run, window_ratio
from simulator.agent import SERIES_FIELDS
from simulator.config import SimConfig
from simulator.live_record import EngineSeries, Recorder, phases, ratio, trailing
from simulator.live_workload import arrival_times, filler, tool_latency

log = logging.getLogger("simulator.live_run")
WINDOW_S = 60


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
        self.engine_series = EngineSeries()
        self.switched = False

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "X-Actor": "live-run"}

    # ------------------------------------------------------------ control
    async def set_mode(self, client: httpx.AsyncClient, mode: str) -> None:
        c = self.cfg.control
        body = {"mode": mode, "low": c.low_band, "high": c.high_band}
        r = await client.put(f"{self.sidecar}/control/budgeter", json=body, timeout=30, headers=self._auth())
        if r.status_code != 200:
            raise RuntimeError(
                f"the sidecar at {self.sidecar} refused control {body}: HTTP {r.status_code} "
                f"{r.text[:300]} (is PREFIXOPS_OPERATOR_TOKEN / --operator-token its token?)"
            )
        log.info(
            "t=%.0fs sidecar control set to %s (bands %.2f/%.2f)", self.now(), mode, c.low_band, c.high_band
        )

    # ------------------------------------------------------------ sessions
    async def session(self, client: httpx.AsyncClient, index: int, arrive: float, system: str) -> None:
        a = self.cfg.agent
        await asyncio.sleep(max(0.0, arrive - self.now()))
        sid = f"lr-{self.nonce}-s{index}"
        rng = random.Random(f"{self.seed}-session-{index}")
        text_rng = random.Random(f"{self.seed}-text-{index}")
        self.in_system.add(sid)
        self.open_sessions.add(sid)
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": filler(text_rng, a.initial_context - a.system_prompt_tokens)},
        ]
        try:
            for turn in range(a.turns):
                headers = {"X-Session-Id": sid}
                if turn == a.turns - 1:
                    headers["X-Session-End"] = "true"
                body: dict[str, Any] = {
                    "model": self.model,
                    "messages": messages,
                    "max_tokens": a.output_tokens,
                }
                if self.ignore_eos:
                    body["ignore_eos"] = True
                answer = await self.turn(client, body, headers)
                if answer is None:
                    return
                if turn == a.turns - 1:
                    self.open_sessions.discard(sid)
                    return
                messages.append({"role": "assistant", "content": answer})
                messages.append(
                    {"role": "user", "content": filler(text_rng, a.context_growth - a.output_tokens)}
                )
                await asyncio.sleep(tool_latency(rng, a))
        finally:
            self.in_system.discard(sid)

    async def turn(
        self, client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]
    ) -> str | None:
        for attempt in range(50):
            try:
                r = await client.post(
                    f"{self.sidecar}/v1/chat/completions",
                    json=body,
                    headers=headers,
                    timeout=httpx.Timeout(900, connect=10),
                )
            except httpx.HTTPError as exc:
                self.rec.errors += 1
                log.warning("turn failed (%s: %s); retrying", type(exc).__name__, exc)
                await asyncio.sleep(min(10, 1 + attempt))
                continue
            if r.status_code == 200:
                data = r.json()
                usage = data.get("usage") or {}
                details = usage.get("prompt_tokens_details") or {}
                self.rec.add(
                    self.now(), int(usage.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0)
                )
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
        s["t"].append(second)
        s["sessions_in_system"].append(len(self.in_system))
        s["parked"].append(backlog.get("parked", 0))
        s["waiting_sessions"].append(backlog.get("waiting", 0))
        s["admitted"].append(backlog.get("admitted", 0))
        s["demand_tokens"].append(budgeter.get("demand_tokens", 0))
        s["projected_demand_tokens"].append(budgeter.get("projected_demand_tokens"))
        s["kv_resident"].append(None)
        self.engine_series.append(s, snap)

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
                log.info(
                    "t=%ds sessions=%d parked=%s R_t(60s)=%s turns(60s)=%d preemptions=%s",
                    second,
                    len(self.in_system),
                    self.series["parked"][-1],
                    None if tw is None else round(tw, 3),
                    sum(self.rec.turns[max(0, second - 60) : second]),
                    self.series["preemptions"][-1],
                )

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
            pool = (
                (await client.get(f"{self.sidecar}/state", timeout=30)).json()["budgeter"].get("pool_tokens")
            )
            self.t0 = time.monotonic()
            await self.set_mode(client, "off")
            system = f"run {self.nonce} " + filler(
                random.Random(f"{self.seed}-system"), a.system_prompt_tokens - 3
            )
            self.t0 = time.monotonic()
            wall0 = time.perf_counter()
            tasks = [asyncio.create_task(self.session(client, i, t, system)) for i, t in enumerate(arrivals)]
            await self.sampler(client)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            wall_s = time.perf_counter() - wall0
            for sid in sorted(
                self.open_sessions
            ):  # end what the run left behind, so the next run starts clean
                with contextlib.suppress(httpx.HTTPError):
                    await client.delete(f"{self.sidecar}/sessions/{sid}", timeout=10, headers=self._auth())
        return self.result(arrivals, wall_s, pool)

    def result(self, arrivals: list[float], wall_s: float, pool: int | None) -> dict[str, Any]:
        a = self.cfg.agent
        s = self.series
        rec = self.rec
        s["turns"], s["prompt_tokens"], s["cached_tokens"], s["hit_turns"] = (
            rec.turns,
            rec.prompt,
            rec.cached,
            rec.hit_turns,
        )
        s["token_weighted"] = ratio(trailing(rec.cached), trailing(rec.prompt))
        s["request_weighted"] = ratio(trailing(rec.hit_turns), trailing(rec.turns))
        s["engine_hit_ratio"] = ratio(trailing(s["engine_hits"]), trailing(s["engine_queries"]))
        s["turns_per_s"] = [round(v / WINDOW_S, 4) for v in trailing(rec.turns)]
        verdict = judge_run(
            rec.prompt,
            rec.cached,
            rec.turns,
            s["sessions_in_system"],
            control_start_min=self.control_start_min,
            minutes=self.minutes,
            window_min=self.judge_window_min,
        )
        summary = verdict.as_dict()
        horizon = self.minutes * 60.0
        q = sum(s["engine_queries"])
        preemptions = [p for p in s["preemptions"] if p is not None]
        summary.update(
            {
                "wall_s": round(wall_s, 1),
                "offered_turns_per_s": round(
                    (a.arrival_rate + a.burst_rate * a.burst_minutes * 60 / horizon) * a.turns, 4
                ),
                "steady_offered_turns_per_s": round(a.arrival_rate * a.turns, 4),
                "preemptions": preemptions[-1] if preemptions else None,
                "engine_hit_ratio_total": round(sum(s["engine_hits"]) / q, 4) if q else None,
                "sessions_arrived": len(arrivals),
                "judge_window_min": self.judge_window_min,
                "turn_errors": rec.errors,
                "held_503_retries": rec.retries,
                "phases": phases(rec, a, self.control_start_min, self.minutes, s["preemptions"]),
            }
        )
        cfg = self.cfg.to_dict()
        cfg["control"]["control_start_min"] = self.control_start_min
        if pool:
            cfg["engine"]["pool_tokens"] = pool
        return {
            "scenario": self.scenario,
            "control": self.control,
            "seed": self.seed,
            "minutes": self.minutes,
            "mode": "live",
            "engine_url": self.engine,
            "sidecar_url": self.sidecar,
            "model": self.model,
            "config": cfg,
            "arrivals": [round(t, 3) for t in arrivals],
            "series": s,
            "summary": summary,
        }
