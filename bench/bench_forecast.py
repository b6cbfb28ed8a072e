"""Forecast speed (issue 16 item 3): a 30-minute and a 6-hour forecast at the collapse demo's traffic.

The recorded window is synthesised with the collapse demo's workload (the agent preset's sessions: 40 turns,
6600-token first prompts growing by 800, 150-token answers, ~1.5 s tool gaps; ~1.5 turns/s recorded), and the
engine holds the collapse's pile-up at the start (40 more admitted sessions of 22.6K tokens on a 400K pool). A forecast runs the current config (``off``) and the proposed one
(``budgeter-park``), as the Budgeter page does. The baseline, measured in the same run: a plain
``simulator run`` (``run_scenario("agent-steady", "off", ...)``) of the same length.

    .venv/bin/python bench/bench_forecast.py
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.budgeter import BudgeterConfig  # noqa: E402
from simulator.forecast import forecast_inputs  # noqa: E402
from simulator.forecast_draws import draws_for, run_draws  # noqa: E402
from simulator.offline import run_scenario  # noqa: E402

NOW = 1_000_000.0
FIT = {
    "step_overhead_s": "0.006",
    "prefill_per_token_s": "3.24e-05",
    "prefill_attention_s": "5.57e-09",
    "decode_per_ctx_token_s": "3.7e-08",
}


def recorded(
    now: float = NOW, seed: int = 0, rate: float = 0.042, crowd: int = 40
) -> tuple[list[dict], list[dict]]:
    """Turn rows of the last hour and the sessions present now, shaped like the collapse demo's traffic.

    ``crowd`` more sessions are in the engine now, mid-way (the collapse demo's pile-up: 6600 + 800 x 20 tokens
    of context each, 20 turns done)."""
    rng = random.Random(seed)
    turns: list[dict] = []
    sessions: list[dict] = []
    t = now - 3600.0
    k = 0
    while True:
        t += rng.expovariate(rate)
        if t >= now:
            break
        k += 1
        sid, ts, prompt, n = f"s{k}", t, 6600, 0
        while n < 40:
            latency = 0.5 + prompt * 4e-5
            done = ts + latency
            if done > now:
                sessions.append(
                    {
                        "session_id": sid,
                        "state": "admitted",
                        "context_tokens": prompt,
                        "turns": n,
                        "manual": False,
                        "pinned": False,
                        "data": {},
                    }
                )
                break
            turns.append(
                {
                    "id": len(turns) + 1,
                    "ts": done,
                    "session": sid,
                    "prompt_tokens": prompt,
                    "cached_tokens": 2000 if n == 0 else prompt - 650,
                    "completion_tokens": 150,
                    "held_s": 0.0,
                    "latency_s": latency,
                    "outcome": "ok",
                }
            )
            n += 1
            prompt += 800
            ts = done + rng.lognormvariate(0.0, 0.5) * 1.5 / math.exp(0.125)
    sessions += [
        {
            "session_id": f"crowd{i}",
            "state": "admitted",
            "context_tokens": 6600 + 800 * 20,
            "turns": 20,
            "manual": False,
            "pinned": False,
            "data": {},
        }
        for i in range(crowd)
    ]
    return turns, sessions


def main() -> int:
    turns, sessions = recorded()
    current = BudgeterConfig(mode="off")
    proposed = current.replace(mode="budgeter-park")
    t0 = time.perf_counter()
    inputs = forecast_inputs(
        pool_tokens=400_000,
        session_rows=sessions,
        turn_rows=turns,
        latency_samples=[],
        fit=FIT,
        current=current,
        now=NOW,
    )
    prep_s = time.perf_counter() - t0
    print(
        f"recorded: {inputs.shapes.turns_seen} turns in 30 min ({inputs.shapes.turns_seen / 1800:.2f} turns/s), "
        f"{len(inputs.sessions)} sessions now; inputs built in {prep_s * 1000:.1f} ms"
    )
    for minutes, target in ((30, 2.0), (360, 10.0)):
        b0 = time.perf_counter()
        run_scenario("agent-steady", "off", 1, minutes)
        base_s = time.perf_counter() - b0
        f0 = time.perf_counter()
        draws = draws_for(minutes)  # as the page runs it: the median of this many draws per config
        runs = [run_draws(inputs, cfg, minutes, seed=1, draws=draws) for cfg in (current, proposed)]
        fc_s = time.perf_counter() - f0 + prep_s
        rt = " vs ".join(
            f"{r['summary']['mode']} R_t {r['summary']['r_t']} {r['summary']['turns_per_s']} turns/s"
            for r in runs
        )
        print(
            f"{minutes:>4} min forecast (2 x {draws} draws): {fc_s:6.2f} s (target <= {target:g} s: "
            f"{'ok' if fc_s <= target else 'MISSED'}); baseline `simulator run` of {minutes} min: {base_s:6.2f} s; "
            f"ratio {fc_s / base_s:.2f}x  [{rt}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
