"""What ``simulator live-run`` offers the engine: the simulator's arrival and tool-latency draws, and filler text.

The draws are those of ``simulator run`` (simulator/agent.py ``run_agent``), seeded the same way, so a
seed offers the same sessions live and offline (tests/engine/test_live_run.py checks the arrivals).
"""

from __future__ import annotations

import math
import random

from simulator.config import AgentWorkload
from simulator.content import words

LIVE_SCENARIOS = ("agent-steady", "agent-burst")
LIVE_CONTROLS = ("off", "budgeter-park")


def arrival_times(a: AgentWorkload, seed: int, horizon: float) -> list[float]:
    """Session arrival times: the one draw ``simulator run`` (simulator/agent.py ``run_agent``) and live-run share."""
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
        arrivals.extend(
            t for k in range(n_burst) if (t := b0 + (k + burst_rng.random()) / a.burst_rate) < horizon
        )
    t = b0
    while a.burst_rate > 0 and a.burst_process == "poisson":
        t += burst_rng.expovariate(a.burst_rate)
        if t >= min(b1, horizon):
            break
        arrivals.append(t)
    return sorted(arrivals)


def tool_latency(rng: random.Random, a: AgentWorkload) -> float:
    """One tool latency, drawn as the simulator draws it (lognormal with mean ``tool_latency_mean``)."""
    return (
        rng.lognormvariate(0.0, a.tool_latency_sigma)
        * a.tool_latency_mean
        / math.exp(a.tool_latency_sigma**2 / 2)
    )


def filler(rng: random.Random, n: int) -> str:
    """``n`` filler words (one token each for the project's tiny model), at least one."""
    return words(rng, max(1, n))
