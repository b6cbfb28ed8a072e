"""``python -m realengine {build,where,serve}``: the real vLLM engine's environment, model and server.

* ``build`` (what ``make engine`` runs): create the engine environment and the
  tiny model when missing (idempotent, reuses the per-user cache), then print
  where they are.
* ``where``: print where they are (JSON), building nothing; exit 1 when not built.
* ``serve``: start ``vllm serve`` on the tiny model with PrefixOps' flags, in the
  foreground (``--port``, ``--pool-tokens``, ``--max-model-len``, ``--threads``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from realengine import env


def _spec(args: argparse.Namespace) -> env.ModelSpec:
    overrides = {
        k: v for k, v in vars(args).items() if k in env.ModelSpec.__dataclass_fields__ and v is not None
    }
    return env.ModelSpec(**overrides)


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    for name in env.ModelSpec.__dataclass_fields__:
        p.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=int,
            default=None,
            help=f"model spec: {name} (default {getattr(env.ModelSpec(), name)})",
        )


def build(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        where = env.ensure(_spec(args))
    except env.EngineEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    where["total_s"] = round(time.monotonic() - t0, 1)
    if args.json:
        print(json.dumps(where, indent=1))
    else:
        print(
            f"engine environment: {where['venv']}\n"
            f"model directory:    {where['model']}\n"
            f"pins:               {where['lock']}\n"
            f"(PREFIXOPS_ENGINE_HOME={where['home']}; built in {where['total_s']} s)"
        )
    return 0


def where(args: argparse.Namespace) -> int:
    spec = _spec(args)
    info = {
        "home": str(env.engine_home()),
        "venv": str(env.venv_dir()),
        "model": str(env.model_dir(spec)),
        "env_ready": env.env_ready(),
        "model_ready": env.model_ready(spec),
    }
    print(json.dumps(info, indent=1))
    return 0 if info["env_ready"] and info["model_ready"] else 1


def serve(args: argparse.Namespace) -> int:
    from realengine.serve import EngineSettings, engine_command, place_engine

    spec = _spec(args)
    if not env.ready(spec):
        print(
            "error: the engine environment or model is missing; run `make engine` first "
            f"(looked in {env.engine_home()})",
            file=sys.stderr,
        )
        return 1
    settings = EngineSettings(
        port=args.port,
        host=args.host,
        pool_tokens=args.pool_tokens,
        max_model_len=args.max_model_len,
        threads=args.threads,
        spec=spec,
    )
    cmd, extra_env = engine_command(settings)
    try:
        placed = place_engine(args.cpus, args.nice)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if placed:
        print(f"realengine serve: {', '.join(placed)}", file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, {**os.environ, **extra_env})
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    from realengine.serve import EngineSettings

    d = EngineSettings()
    parser = argparse.ArgumentParser(prog="python -m realengine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="build the engine environment and the tiny model (make engine)")
    p.add_argument("--json", action="store_true")
    _add_spec_args(p)
    p.set_defaults(func=build)
    p = sub.add_parser("where", help="where the environment and the model are (JSON)")
    _add_spec_args(p)
    p.set_defaults(func=where)
    p = sub.add_parser("serve", help="vllm serve the tiny model with PrefixOps' flags (foreground)")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--pool-tokens", type=int, default=d.pool_tokens, help="KV pool (rounded down to blocks)")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--threads", type=int, default=d.threads, help="CPU threads of the engine")
    p.add_argument(
        "--cpus",
        default=None,
        help="pin the engine to these CPUs (taskset syntax: 0, 0,1, 0-3; default: not pinned)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=None,
        help="the engine's nice, applied to its own session's autogroup too (negative: root; default: unchanged)",
    )
    _add_spec_args(p)
    p.set_defaults(func=serve)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
