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

The engine's series (KV usage, running, waiting, preemptions, prefix-cache queries and hits,
prompt, cached and generation token counters) are sampled from its ``/metrics`` every second with
the meaning they have in ``simulator run`` (simulator/live_record.py), so the collapse-risk warning
can be replayed on a live run (``simulator live-warning``, simulator/live_warning.py). Series the
real engine cannot give are ``null``: ``kv_resident`` (vLLM has no gauge of cached-but-free blocks).

Modules: this one is the command; simulator/live_workload.py the sessions' draws,
simulator/live_driver.py the wall-clock driver, simulator/live_record.py what is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import httpx

from simulator.agent import CONTROLS
from simulator.config import SimConfigError, apply_overrides, parse_set_args
from simulator.fit import preset_overrides
from simulator.live_driver import LiveRun
from simulator.live_workload import LIVE_CONTROLS, LIVE_SCENARIOS, arrival_times, tool_latency
from simulator.offline import scenario_config
from simulator.plots import plot_run

__all__ = [
    "LIVE_CONTROLS",
    "LIVE_SCENARIOS",
    "LiveRun",
    "add_arguments",
    "arrival_times",
    "live_run_command",
    "tool_latency",
]
log = logging.getLogger("simulator.live_run")


# ------------------------------------------------------------------ command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine base URL (its /metrics is sampled every second)")
    p.add_argument(
        "--sidecar", required=True, help="sidecar base URL in front of that engine (traffic goes here)"
    )
    p.add_argument("--scenario", required=True, choices=LIVE_SCENARIOS)
    p.add_argument("--control", default="off", choices=LIVE_CONTROLS)
    p.add_argument(
        "--control-start-min",
        type=float,
        required=True,
        help="wall-clock minute at which the sidecar's control switches from off to --control",
    )
    p.add_argument("--minutes", type=float, required=True, help="wall-clock minutes to run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--operator-token", default=None, help="sidecar operator token (default $PREFIXOPS_OPERATOR_TOKEN)"
    )
    p.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    p.add_argument(
        "--no-ignore-eos", action="store_true", help="do not send ignore_eos (engines that reject it)"
    )
    p.add_argument(
        "--judge-window-min",
        type=float,
        default=1.0,
        help="core.runs window for degraded/recovered (the offline runs use 5 of 90 simulated "
        "minutes; a run of a few wall minutes uses 1)",
    )
    p.add_argument(
        "--preset", default=None, help="a named set of --set values (see simulator/fit.py PRESETS)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="workload or control setting (the simulator's keys; repeatable)",
    )


def live_run_command(args: argparse.Namespace) -> int:
    token = args.operator_token or os.environ.get("PREFIXOPS_OPERATOR_TOKEN")
    if not token:
        print(
            "error: the sidecar's operator token is needed to switch its control: --operator-token or "
            "PREFIXOPS_OPERATOR_TOKEN",
            file=sys.stderr,
        )
        return 2
    if not 0 <= args.control_start_min <= args.minutes:
        print(
            f"error: --control-start-min must be within the run (0..{args.minutes:g}), got "
            f"{args.control_start_min:g}",
            file=sys.stderr,
        )
        return 2
    try:
        overrides = {**preset_overrides(args.preset, args.scenario), **parse_set_args(args.set)}
        cfg = apply_overrides(scenario_config(args.scenario), overrides)
        cfg = replace(cfg, control=replace(cfg.control, control_start_min=args.control_start_min))
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    assert args.control in CONTROLS
    run = LiveRun(
        engine=args.engine.rstrip("/"),
        sidecar=args.sidecar.rstrip("/"),
        scenario=args.scenario,
        control=args.control,
        control_start_min=args.control_start_min,
        minutes=args.minutes,
        seed=args.seed,
        cfg=cfg,
        token=token,
        model=args.model,
        ignore_eos=not args.no_ignore_eos,
        judge_window_min=args.judge_window_min,
    )
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
    print(
        f"live {args.scenario} control={args.control} seed={args.seed} minutes={args.minutes:g} "
        f"collapsed={sm['collapsed']} recovered={sm['recovered']} minutes_to_recover={sm['minutes_to_recover']} "
        f"end_hit_ratio={sm['end_hit_ratio']} end_turns_per_s={sm['end_turns_per_s']} "
        f"preemptions={sm['preemptions']} sessions_arrived={sm['sessions_arrived']} wall_s={sm['wall_s']} "
        f"phases={json.dumps(sm['phases'])}"
    )
    return 0
