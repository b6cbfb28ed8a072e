"""`make demo` end to end: every process comes up, traffic flows, SIGTERM stops them all."""

import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest

from tests.support import PYTHON, free_port, read_log, running

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("heavy")]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s (last seen: {last!r})")


def test_demo_brings_up_everything_with_traffic_and_stops_on_sigterm(tmp_path):
    ports = {name: free_port() for name in ("engine", "sidecar", "dashboard")}
    cmd = [PYTHON, "-m", "demo", "--engine-port", str(ports["engine"]), "--sidecar-port", str(ports["sidecar"]),
           "--dashboard-port", str(ports["dashboard"]), "--data-dir", str(tmp_path), "--speed", "8"]
    env = {"PREFIXOPS_OPERATOR_TOKEN": "", "PREFIXOPS_OPERATOR_PASSPHRASE": ""}
    with running(cmd, name="demo", env=env) as proc:
        wait_for(lambda: "PrefixOps is up." in read_log(proc), 150, "the demo did not report itself up")
        banner = read_log(proc)
        assert f"http://127.0.0.1:{ports['dashboard']}" in banner
        assert "passphrase:" in banner and "operator token" in banner
        up_at = time.monotonic()
        sidecar = f"http://127.0.0.1:{ports['sidecar']}"

        def traffic_seen():
            state = httpx.get(f"{sidecar}/state", timeout=2).json()
            return state["reuse"]["token_weighted"] is not None

        wait_for(traffic_seen, 30, "no demo traffic reached the sidecar")
        assert time.monotonic() - up_at <= 30

        def collected():
            out = subprocess.run([PYTHON, "-m", "collectors", "status", "--json", "--database-url",
                                  f"sqlite:///{tmp_path / 'prefixops.db'}"], capture_output=True, text=True,
                                 timeout=30, check=True).stdout
            rows = json.loads(out)
            return [r for r in rows if r["up"] and r["token_weighted"] is not None]

        wait_for(collected, 30, "the collectors stored no hit rate")

        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=40)
        assert proc.returncode == 0, read_log(proc)[-3000:]
    for name, port in ports.items():
        assert not listening(port), f"{name} still listens on {port} after the demo stopped"
