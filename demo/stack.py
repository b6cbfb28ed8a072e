"""The demo's stack: the fleet file, the processes it starts (the simulated or the real engine, a sidecar,
the collectors, the dashboard and a load generator), its admin account, and the control-mode switch it
makes through the sidecar's authenticated API."""

from __future__ import annotations

import argparse
import logging
import sys

import httpx

from demo.real_engine import LOADGEN_ARGS as REAL_LOADGEN_ARGS
from demo.real_engine import real_engine_service, real_fleet_toml
from demo.scenarios import collapse_alert_table, loadgen_args, rag_sidecar_args
from demo.services import REPO, Service

log = logging.getLogger("demo")
# The demo's fleet: one simulated engine and the sidecar in front of it, named as an operator would.
FLEET_TOML = """\
# Written by `python -m demo`; the collectors reload it on change.
[[engines]]
url = "{engine}"
kind = "vllm"
name = "sim-engine"
labels = {{ cluster = "demo", model = "simulated" }}

[[sidecars]]
url = "{sidecar}"
engine = "{engine}"
name = "sim-engine sidecar"
"""


def set_control_mode(sidecar: str, token: str, mode: str) -> None:
    """Set the sidecar's control mode as an operator would: authenticated, and recorded in its audit log."""
    response = httpx.put(
        f"{sidecar}/control/budgeter",
        json={"mode": mode},
        timeout=10,
        headers={"Authorization": f"Bearer {token}", "X-Actor": "demo"},
    )
    if response.status_code != 200:
        raise RuntimeError(
            f"the sidecar refused mode {mode!r}: HTTP {response.status_code} {response.text[:300]}"
        )
    log.info("sidecar control mode set to %s (recorded in its audit log as actor 'demo')", mode)


DEMO_ADMIN = "admin"


def ensure_admin_account(database_url: str, password: str) -> str:
    """Create the demo's admin account (or give the existing one this password); returns its name."""
    from core.accounts import AccountError
    from db import accounts, make_engine
    from db.migrate import upgrade

    engine = make_engine(database_url)
    try:
        upgrade(engine)
        try:
            accounts.add_account(engine, DEMO_ADMIN, "admin", password, actor="demo", method="cli")
        except AccountError:  # left by an earlier run in this data directory
            accounts.set_role(engine, DEMO_ADMIN, "admin", actor="demo", method="cli")
            accounts.set_password(engine, DEMO_ADMIN, password, actor="demo", method="cli")
    finally:
        engine.dispose()
    return DEMO_ADMIN


def engine_url(args: argparse.Namespace) -> str:
    """The engine the sidecar fronts: ``--engine-url`` (a running engine), else the one the demo starts."""
    return args.engine_url or f"http://{args.host}:{args.engine_port}"


def database_url_for(args: argparse.Namespace) -> str:
    return args.database_url or f"sqlite:///{args.data_dir / 'prefixops.db'}"


def build_services(args: argparse.Namespace, operator_token: str) -> list[Service]:
    """The processes to start, in order. With ``--engine-url`` the engine is already running: none is started."""
    py = sys.executable
    if args.engine == "vllm" and not args.engine_url:
        real = real_engine_service(args.host, args.engine_port)
    host = args.host
    engine = engine_url(args)
    sidecar = f"http://{host}:{args.sidecar_port}"
    database_url = database_url_for(args)
    fleet = args.data_dir / "fleet.toml"
    toml = FLEET_TOML.format(engine=engine, sidecar=sidecar)
    if args.scenario == "collapse":
        toml += collapse_alert_table(args.speed)
    fleet.write_text(toml)
    seed = [] if getattr(args, "seed", None) is None else ["--seed", str(args.seed)]

    def loadgen(speed: float, *flags: str) -> list[str]:
        """The load generator's command against the sidecar."""
        return [py, "-m", "simulator", "loadgen", "--target", sidecar, "--speed", str(speed), *flags]

    common = {
        "DATABASE_URL": database_url,
        "PREFIXOPS_OPERATOR_TOKEN": operator_token,
        "PREFIXOPS_CONFIG": str(fleet),
    }
    services = [
        Service(
            "simulator",
            [
                py,
                "-m",
                "simulator",
                "serve",
                "--host",
                host,
                "--port",
                str(args.engine_port),
                "--speed",
                str(args.speed),
                *seed,
            ],
            ready_url=f"{engine}/health",
        ),
        Service(
            "sidecar",
            [
                py,
                "-m",
                "sidecar",
                "--engine",
                engine,
                "--host",
                host,
                "--port",
                str(args.sidecar_port),
                "--state-db",
                str(args.data_dir / "sidecar.db"),
                *(rag_sidecar_args(args.speed) if args.scenario == "rag" else []),
            ],
            ready_url=f"{sidecar}/healthz",
            env=common,
        ),
        Service(
            "collectors",
            [py, "-m", "collectors", "--config", str(fleet), "--database-url", database_url],
            env=common,
        ),
        Service(
            "dashboard",
            [
                py,
                "-m",
                "streamlit",
                "run",
                str(REPO / "app.py"),
                "--server.address",
                host,
                "--server.port",
                str(args.dashboard_port),
                "--server.headless",
                "true",
                "--browser.gatherUsageStats",
                "false",
            ],
            ready_url=f"http://{host}:{args.dashboard_port}/_stcore/health",
            env=common,
        ),
        Service("loadgen", loadgen(args.speed, *seed, *loadgen_args(args.scenario, args.speed))),
    ]
    if args.engine == "vllm":  # PREFIXOPS_DEMO_ENGINE=vllm: the real engine in place of the simulator
        if args.engine_url:
            services.pop(0)
        else:
            services[0] = Service("vllm", real.cmd, ready_url=real.ready_url, env=real.env)
        fleet.write_text(real_fleet_toml(toml))
        services[-1].cmd = loadgen(1, *REAL_LOADGEN_ARGS)
    for service in services:
        service.log_dir = args.data_dir / "logs"
    return services
