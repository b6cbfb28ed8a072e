"""``python -m simulator warning-eval``: how early does the collapse-risk warning come? (issue 15)

Runs ``agent-steady``, ``agent-burst`` and ``agent-flush`` (in turn) under control ``off``, with
burst size, arrival rate and pool drawn per run across the tipping point (`run_plan`), then
replays each run's per-second series through the collectors' own code: engine counters become an
`core.engine_metrics.EngineSnapshot` per second and go through ``interval_signals``; the sidecar's
``/state`` is rebuilt and goes through ``collectors.sidecar_docs.state_signals`` and
``core.rates.counter_rate``; the resulting signal points feed the alert evaluator
(`core.alerts`), which computes the collapse risk (`core.risk`) and the ``collapse-risk`` and
``collapse`` alerts exactly as the collectors do, once per simulated second (their scrape
interval). Sidecar inputs and engine-only inputs are replayed separately.

Definitions (issue 15):

* *degraded*: `core.runs.degraded_minutes` (5-minute token-weighted hit rate <= 0.3) at a minute
  >= ``runs.WINDOW_MIN`` (earlier windows are shorter than 5 minutes: a run whose first session
  has not finished a turn by minute 1 is not a collapse);
* *onset*: in a degraded run, the last time before its first degraded minute that the
  token-weighted hit rate over the trailing 30 s fell below 0.3 (`onset_s`);
* *warned before degraded*: the first ``collapse-risk`` firing at least ``LEAD_S[mode]`` before
  the onset; *lead* = onset - first firing;
* *false alarm run*: a firing before the onset (any firing in a run without one) that is not
  followed by an onset within ``FALSE_ALARM_S``.

Each run is judged over its first ``--minutes`` and simulated ``FALSE_ALARM_S`` longer (the follow-up),
so a warning near the end is judged on what followed it (`judge`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Iterator, Sequence
from multiprocessing import Pool
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collectors import sidecar_docs as docs
from core import engine_metrics as em
from core import rates, runs
from core import signals as sig
from simulator.offline import run_scenario

if TYPE_CHECKING:
    from core.alerts import AlertSettings

SCENARIOS = ("agent-steady", "agent-burst", "agent-flush")
MODES = ("sidecar", "engine")
LEAD_S = {"sidecar": 60.0, "engine": 30.0}
FALSE_ALARM_S = 600.0
ONSET_WINDOW_S = 30
DEFAULT_SEED_BASE = 50_000  # not a tuning base (docs/collapse-risk.md)
BURST_SESSIONS = (10, 30)
PRESET_ARRIVAL = 0.035
PRESET_POOL = 400_000


# ------------------------------------------------------------------ the runs
def run_plan(index: int, seed: int) -> tuple[str, dict[str, str]]:
    """Scenario and ``--set`` overrides of run ``index`` (seeded: the same seed gives the same run).

    Bursts of 10-30 sessions with arrivals and pool within 10% of the preset straddle the
    tipping point (~18 sessions at the preset); steady and flush runs get 0-60% more arrivals and a
    pool from -15% to +10%, so some tip on their own and most come close without tipping."""
    rng = random.Random(f"{seed}-warning-eval")
    scenario = SCENARIOS[index % len(SCENARIOS)]
    if scenario == "agent-burst":
        sessions = rng.randint(*BURST_SESSIONS)
        over = {
            "burst_rate": sessions / 300.0,
            "arrival_rate": PRESET_ARRIVAL * rng.uniform(0.9, 1.1),
            "pool_tokens": int(PRESET_POOL * rng.uniform(0.9, 1.1)),
        }
    else:
        over = {
            "arrival_rate": PRESET_ARRIVAL * rng.uniform(1.0, 1.6),
            "pool_tokens": int(PRESET_POOL * rng.uniform(0.85, 1.1)),
        }
    return scenario, {k: f"{v:.6g}" for k, v in over.items()}


def onset_s(prompt: Sequence[float], cached: Sequence[float], first_degraded_min: int) -> int | None:
    """Last second before the first degraded minute at which the trailing-30-s hit rate fell below 0.3."""
    end = min(len(prompt), first_degraded_min * 60)
    prev: float | None = None
    last: int | None = None
    p_acc = c_acc = 0.0
    for t in range(end):
        p_acc += prompt[t]
        c_acc += cached[t]
        if t >= ONSET_WINDOW_S:
            p_acc -= prompt[t - ONSET_WINDOW_S]
            c_acc -= cached[t - ONSET_WINDOW_S]
        if p_acc <= 0:
            continue
        value = c_acc / p_acc
        if value < runs.DEGRADED_THRESHOLD and (prev is None or prev >= runs.DEGRADED_THRESHOLD):
            last = t + 1  # entry t covers (t, t+1]
        prev = value
    return last


def _cumsum(values: Sequence[float]) -> list[float]:
    out, acc = [], 0.0
    for v in values:
        acc += v
        out.append(acc)
    return out


def signal_points(result: dict[str, Any]) -> dict[str, Iterator[tuple[float, dict[str, float]]]]:
    """Per-second signal points as the collectors would store them: ``{"sidecar": ..., "engine": ...}``."""
    s = result["series"]
    cfg = result["config"]
    pool = (
        int(cfg["engine"]["pool_tokens"])
        // int(cfg["engine"]["block_size"])
        * int(cfg["engine"]["block_size"])
    )
    queries, hits, turns = _cumsum(s["engine_queries"]), _cumsum(s["engine_hits"]), _cumsum(s["turns"])

    def engine() -> Iterator[tuple[float, dict[str, float]]]:
        prev = prev_ts = None
        for i, t in enumerate(s["t"]):
            snap = em.EngineSnapshot(
                engine_label="0",
                prefix_cache_queries=queries[i],
                prefix_cache_hits=hits[i],
                prompt_tokens=s["engine_prompt_tokens"][i],
                generation_tokens=s["generation_tokens"][i],
                cached_tokens=s["engine_cached_tokens"][i],
                preemptions=s["preemptions"][i],
                kv_usage=s["kv_usage"][i],
                requests_running=s["running"][i],
                requests_waiting=s["waiting"][i],
                pool_tokens=pool,
            )
            values = em.interval_signals(prev, prev_ts, snap, float(t), max_gap_s=5.0).values
            prev, prev_ts = snap, float(t)
            yield float(t), values

    def sidecar() -> Iterator[tuple[float, dict[str, float]]]:
        control = cfg["control"]
        prev_turns = prev_ts = None
        for i, t in enumerate(s["t"]):
            rt, rr = s["token_weighted"][i], s["request_weighted"][i]
            state = {
                "started_at": 0.0,
                "reuse": {
                    "token_weighted": rt,
                    "request_weighted": rr,
                    "divergence": None if rt is None or rr is None else rr - rt,
                },
                "budgeter": {
                    "mode": result["control"],
                    "low": control["low_band"],
                    "high": control["high_band"],
                    "pool_tokens": pool,
                    "demand_tokens": s["demand_tokens"][i],
                    "projected_demand_tokens": (s.get("projected_demand_tokens") or [None] * len(s["t"]))[i],
                },
                "backlog": {
                    "admitted": s["admitted"][i],
                    "parked": s["parked"][i],
                    "waiting": s["waiting_sessions"][i],
                },
                "traffic": {"turns_total": turns[i]},
            }
            values = docs.state_signals(state)
            rate = rates.counter_rate(prev_turns, prev_ts, turns[i], float(t), max_gap_s=5.0)
            if rate is not None:
                values[sig.TURNS_PER_S] = rate
            prev_turns, prev_ts = turns[i], float(t)
            yield float(t), values

    return {"sidecar": sidecar(), "engine": engine()}


def firings(
    points: Iterator[tuple[float, dict[str, float]]], mode: str, settings: AlertSettings | None = None
) -> dict[str, list[float]]:
    """Replay through the alert evaluator (the collectors' path); firing times per rule.

    ``settings``: the collectors' alert settings (default `AlertSettings()`); a real engine's replay
    passes its own prefill capacity (simulator/live_warning.py)."""
    from core.alerts import AlertEvaluator

    url = f"replay-{mode}"
    evaluator = AlertEvaluator(settings)
    out: dict[str, list[float]] = {"collapse-risk": [], "collapse": []}
    label = "" if mode == "sidecar" else "0"
    for ts, values in points:
        evaluator.observe_scrape(url, ts, True)
        evaluator.observe((url, label), ts, values)
        for x in evaluator.evaluate_target(url, ts, role=mode, engine_labels=(label,)):
            if x.event == "firing" and x.rule in out:
                out[x.rule].append(x.ts)
    return out


def judge(index: int, seed: int, minutes: float) -> dict[str, Any]:
    """One run: its plan, verdict, onset and the alerts' firing times per input set.

    The run is simulated ``FALSE_ALARM_S`` beyond ``minutes`` (the follow-up): warnings and onsets are
    judged within ``minutes``, and the follow-up only tells whether a late warning was followed by an
    onset within ``FALSE_ALARM_S`` (without it, every warning in the last 10 minutes would be judged
    against a run that stopped)."""
    scenario, overrides = run_plan(index, seed)
    horizon = minutes + FALSE_ALARM_S / 60.0
    result = run_scenario(scenario, "off", seed, horizon, overrides)
    s = result["series"]
    degraded = [
        m
        for m in runs.degraded_minutes(
            s["prompt_tokens"], s["cached_tokens"], s["sessions_in_system"], horizon
        )
        if m >= runs.WINDOW_MIN
    ]
    onset = onset_s(s["prompt_tokens"], s["cached_tokens"], degraded[0]) if degraded else None
    points = signal_points(result)
    observed = minutes * 60.0
    out: dict[str, Any] = {
        "index": index,
        "seed": seed,
        "scenario": scenario,
        "overrides": overrides,
        "first_degraded_min": degraded[0] if degraded else None,
        "onset_s": onset if onset is not None and onset <= observed else None,
        "onset_in_follow_up_s": onset if onset is not None and onset > observed else None,
    }
    for mode in MODES:
        fired = firings(points[mode], mode)
        out[mode] = {rule: [t for t in times if t <= observed] for rule, times in fired.items()}
    return out


# ------------------------------------------------------------------ the figures
def _lead_stats(leads: list[float]) -> dict[str, float | None]:
    return {
        "lead_s_min": min(leads) if leads else None,
        "lead_s_median": statistics.median(leads) if leads else None,
    }


def summarize(results: list[dict[str, Any]], mode: str, rule: str = "collapse-risk") -> dict[str, Any]:
    """The issue's figures for one input set and one rule."""
    degraded = [r for r in results if r["onset_s"] is not None]
    leads, warned, false_alarms, unwarned = [], 0, 0, []
    for r in results:
        fired = r[mode][rule]
        onset = r["onset_s"]
        if onset is not None and fired:
            lead = onset - fired[0]
            leads.append(lead)
            if lead >= LEAD_S[mode]:
                warned += 1
        if onset is not None and (not fired or onset - fired[0] < LEAD_S[mode]):
            unwarned.append(r["seed"])
        later = onset if onset is not None else r.get("onset_in_follow_up_s")
        early = [t for t in fired if later is None or t < later]
        if any(later is None or later - t > FALSE_ALARM_S for t in early):
            false_alarms += 1
    return {
        "runs": len(results),
        "degraded_runs": len(degraded),
        "warned_before_degraded": warned,
        "non_degraded_runs": len(results) - len(degraded),
        **_lead_stats(leads),
        "false_alarm_runs": false_alarms,
        "required_lead_s": LEAD_S[mode],
        "late_or_missed_seeds": unwarned,
    }


def evaluate(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        figures = summarize(results, mode)
        collapse = summarize(results, mode, "collapse")
        figures["collapse_alert"] = {
            k: collapse[k]
            for k in ("warned_before_degraded", "lead_s_min", "lead_s_median", "false_alarm_runs")
        }
        figures["collapse_alert"]["fired_in_degraded_runs"] = sum(
            1 for r in results if r["onset_s"] is not None and r[mode]["collapse"]
        )
        out[mode] = figures
    return out


def _job(args: tuple[int, int, float]) -> dict[str, Any]:
    return judge(*args)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=24, help="runs (scenarios in turn, seeds seed-base..)")
    p.add_argument(
        "--seed-base",
        type=int,
        default=DEFAULT_SEED_BASE,
        help="first seed (the default is not one of the tuning bases, docs/collapse-risk.md)",
    )
    p.add_argument(
        "--minutes",
        type=float,
        default=45.0,
        help="simulated minutes judged per run (each run is simulated 10 minutes longer, the follow-up)",
    )
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--out", required=True, type=Path, help="directory for warning.json and warning.md")


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"Seeds {data['seed_base']}..{data['seed_base'] + data['runs'] - 1}, {data['minutes']:g} simulated "
        "minutes, control `off`:",
        "",
        "| inputs | runs | degraded | warned ≥ lead before onset | lead min / median (s) | non-degraded "
        "| false-alarm runs | collapse alert: before onset, lead median (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        f = data[mode]
        c = f["collapse_alert"]
        lines.append(
            f"| {mode} | {f['runs']} | {f['degraded_runs']} | {f['warned_before_degraded']} "
            f"(≥ {f['required_lead_s']:g} s) | {f['lead_s_min']} / {f['lead_s_median']} | "
            f"{f['non_degraded_runs']} | {f['false_alarm_runs']} | {c['warned_before_degraded']}, "
            f"{c['lead_s_median']} |"
        )
    return "\n".join(lines) + "\n"


def command(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.runs < 1:
        print(f"error: --runs must be >= 1, got {args.runs}", file=sys.stderr)
        return 2
    if not (math.isfinite(args.minutes) and args.minutes >= 10):
        print(f"error: --minutes must be >= 10, got {args.minutes}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(i, args.seed_base + i, args.minutes) for i in range(args.runs)]
    workers = max(1, args.jobs or 0) if args.jobs else None
    with Pool(workers) as pool:
        results = list(tqdm(pool.imap(_job, jobs), total=len(jobs), desc="warning-eval runs", unit="run"))
    data = {
        "seed_base": args.seed_base,
        "runs": args.runs,
        "minutes": args.minutes,
        "command": " ".join(["python -m simulator", *sys.argv[1:]]),
        **evaluate(results),
        "run_results": results,
    }
    (args.out / "warning.json").write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    md = markdown(data)
    (args.out / "warning.md").write_text(md)
    print(md)
    return 0
