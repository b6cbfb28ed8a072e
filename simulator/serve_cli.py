"""``python -m simulator serve``: its flags and the command (the server itself is ``simulator.server``).

``--pool-tokens``, ``--block-size`` and ``--mode`` are shorthands for ``--set``
of the same engine key. A flag and a ``--set`` of the same key that disagree are
an error naming both; neither silently wins. Without either, the engine's own
default (``simulator.config.EngineConfig``) applies.
"""

from __future__ import annotations

import argparse
import sys

from simulator.config import EngineConfig, SimConfig, SimConfigError, apply_overrides, parse_set_args

ENGINE_FLAGS = ("pool_tokens", "block_size", "mode")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    from simulator.server import DEFAULT_MODEL

    engine = EngineConfig()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument(
        "--pool-tokens",
        type=int,
        default=None,
        help=f"KV pool size in tokens; same as --set pool_tokens=N (default {engine.pool_tokens})",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help=f"same as --set block_size=N (default {engine.block_size})",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mode",
        choices=["fast", "exact"],
        default=None,
        help=f"same as --set mode=M (default {engine.mode})",
    )
    p.add_argument(
        "--output-tokens",
        type=int,
        default=200,
        help="mean natural answer length when max_tokens does not cut it",
    )
    p.add_argument(
        "--no-prompt-tokens-details",
        action="store_true",
        help="behave like vLLM without --enable-prompt-tokens-details (no cached_tokens)",
    )
    p.add_argument(
        "--gc",
        choices=["loop", "auto"],
        default="loop",
        help="loop: the garbage collector runs between the engine loop's turns (default); auto: "
        "Python's automatic collection, anywhere in a step (the baseline of bench/bench_live_engine.py)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine or cost-model setting (repeatable)",
    )


def serve_config(args: argparse.Namespace) -> SimConfig:
    """The engine and cost settings of ``serve``: ``--set`` plus the shorthand flags (see the module doc)."""
    overrides: dict[str, object] = dict(parse_set_args(args.set))
    from_set = apply_overrides(SimConfig(), overrides)
    for key in ENGINE_FLAGS:
        flag = getattr(args, key)
        if flag is None:
            continue
        if key in overrides and getattr(from_set.engine, key) != flag:
            raise SimConfigError(
                f"--{key.replace('_', '-')} {flag} and --set {key}={overrides[key]} disagree; "
                "give only one of them"
            )
        overrides[key] = flag
    return apply_overrides(SimConfig(), overrides)


def serve_command(args: argparse.Namespace) -> int:
    from simulator.server import ServeConfig, serve_main

    try:
        config = serve_config(args)
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.speed <= 0:
        print(f"error: --speed must be > 0, got {args.speed}", file=sys.stderr)
        return 2
    serve = ServeConfig(
        model=args.model,
        speed=args.speed,
        seed=args.seed,
        default_output_tokens=args.output_tokens,
        prompt_tokens_details=not args.no_prompt_tokens_details,
        gc_between_turns=args.gc == "loop",
    )
    serve_main(args.host, args.port, config.engine, serve, config.cost, log_level=args.log_level)
    return 0
