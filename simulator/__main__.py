"""Command line: ``python -m simulator {serve,loadgen,run,table3,compaction,live-run,fit}``; ``--help`` on each."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from simulator.config import SimConfigError

log = logging.getLogger("simulator")


def _serve(args: argparse.Namespace) -> int:
    from simulator.config import CostModel, EngineConfig, SimConfig, apply_overrides, parse_set_args
    from simulator.server import ServeConfig, serve_main

    try:
        config = apply_overrides(SimConfig(), parse_set_args(args.set))
        engine = EngineConfig(**{**config.engine.__dict__, "pool_tokens": args.pool_tokens,
                                 "block_size": args.block_size, "mode": args.mode})
    except (SimConfigError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.speed <= 0:
        print(f"error: --speed must be > 0, got {args.speed}", file=sys.stderr)
        return 2
    serve = ServeConfig(model=args.model, speed=args.speed, seed=args.seed,
                        default_output_tokens=args.output_tokens,
                        prompt_tokens_details=not args.no_prompt_tokens_details)
    cost: CostModel = config.cost
    serve_main(args.host, args.port, engine, serve, cost, log_level=args.log_level)
    return 0


def _loadgen(args: argparse.Namespace) -> int:
    from simulator.loadgen import LoadgenConfig, run_loadgen

    try:
        cfg = LoadgenConfig.from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run_loadgen(cfg)


def _run(args: argparse.Namespace) -> int:
    from simulator.experiments import run_command
    from simulator.fit import fit_overrides, preset_overrides

    # --preset and --fit (simulator/fit.py) become --set values that the command's own --set override
    extra = {**preset_overrides(args.preset, args.scenario), **(fit_overrides(args.fit) if args.fit else {})}
    args.set = [f"{k}={v}" for k, v in extra.items()] + list(args.set)
    return run_command(args)


def _live_run(args: argparse.Namespace) -> int:
    from simulator.live_run import live_run_command

    return live_run_command(args)


def _fit(args: argparse.Namespace) -> int:
    from simulator.fit import fit_command

    return fit_command(args)


def _table3(args: argparse.Namespace) -> int:
    from simulator.experiments import table3_command

    return table3_command(args)


def _compaction(args: argparse.Namespace) -> int:
    from simulator.experiments import compaction_command

    return compaction_command(args)


def build_parser() -> argparse.ArgumentParser:
    from simulator.server import DEFAULT_MODEL

    parser = argparse.ArgumentParser(prog="python -m simulator", description=__doc__)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="the simulated engine behind a vLLM-compatible HTTP API")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--pool-tokens", type=int, default=400_000, help="KV pool size in tokens")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=["fast", "exact"], default="fast")
    p.add_argument("--output-tokens", type=int, default=200,
                   help="mean natural answer length when max_tokens does not cut it")
    p.add_argument("--no-prompt-tokens-details", action="store_true",
                   help="behave like vLLM without --enable-prompt-tokens-details (no cached_tokens)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="engine or cost-model setting (repeatable)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("loadgen", help="closed-loop agent sessions (and optional RAG) through the sidecar")
    from simulator.loadgen import add_arguments

    add_arguments(p)
    p.set_defaults(func=_loadgen)

    from simulator.experiments import add_compaction_arguments, add_run_arguments, add_table3_arguments

    p = sub.add_parser("run", help="one offline run of a scenario under a control")
    add_run_arguments(p)
    p.add_argument("--fit", type=Path, default=None, help="fit.json of `simulator fit`: cost model and pool")
    p.add_argument("--preset", default=None, help="named workload settings (simulator/fit.py PRESETS)")
    p.set_defaults(func=_run)
    from simulator.fit import add_fit_arguments
    from simulator.live_run import add_arguments as add_live_run_arguments

    p = sub.add_parser("live-run", help="agent workloads against a real engine through the sidecar (wall clock)")
    add_live_run_arguments(p)
    p.set_defaults(func=_live_run)
    p = sub.add_parser("fit", help="probe a real engine and fit the cost model and pool (fit.json)")
    add_fit_arguments(p)
    p.set_defaults(func=_fit)
    p = sub.add_parser("table3", help="pairs and the five controls across seeds (the published table 3)")
    add_table3_arguments(p)
    p.set_defaults(func=_table3)
    p = sub.add_parser("compaction", help="rag-storm: request-count compaction trigger vs the compaction gate")
    add_compaction_arguments(p)
    p.set_defaults(func=_compaction)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
