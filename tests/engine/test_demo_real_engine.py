"""`PREFIXOPS_DEMO_ENGINE=vllm python -m demo` on the real vLLM engine: it comes up, its traffic flows through
the sidecar to the engine, the collectors read the engine under its real name, and SIGTERM stops what the
demo started.

It reuses the suite's one engine (``--engine-url``, the session fixture of ``conftest.py``) instead of
starting a second one: same xdist group as ``test_real_engine.py``, so it runs on that module's worker,
before or after it, never beside it (those tests measure counter deltas of their own traffic).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import httpx
import pytest

from tests.engine.conftest import POOL_TOKENS
from tests.support import PYTHON, free_port, read_log, running, wait_for

pytestmark = [pytest.mark.xdist_group(name="real-engine"), pytest.mark.timeout(900), pytest.mark.slow]
TOLERATE = (httpx.HTTPError, ValueError, KeyError, subprocess.CalledProcessError)


def test_the_real_engine_demo_starts_and_serves_traffic(real_engine, tmp_path):
    ports = {"sidecar": free_port(), "dashboard": free_port()}
    database = f"sqlite:///{tmp_path / 'prefixops.db'}"
    cmd = [
        PYTHON,
        "-m",
        "demo",
        "--sidecar-port",
        str(ports["sidecar"]),
        "--dashboard-port",
        str(ports["dashboard"]),
        "--data-dir",
        str(tmp_path),
    ]
    env = {
        "PREFIXOPS_DEMO_ENGINE": "vllm",
        "PREFIXOPS_DEMO_ENGINE_URL": real_engine.url,
        "PREFIXOPS_OPERATOR_TOKEN": "",
        "PREFIXOPS_DATABASE_URL": "",
        "DATABASE_URL": "",
    }
    sidecar = f"http://127.0.0.1:{ports['sidecar']}"
    with running(cmd, name="demo-vllm", env=env, log_dir=tmp_path / "logs") as proc:
        wait_for(lambda: "PrefixOps is up." in read_log(proc), 300, "the real-engine demo did not come up")
        banner = read_log(proc)
        assert re.search(rf"engine\s+{re.escape(real_engine.url)}\s+\(real vLLM, already running", banner), (
            banner
        )
        assert "starting vllm" not in banner and "Running upgrade" not in banner

        def served() -> dict:
            state = httpx.get(f"{sidecar}/state", timeout=5).json()
            return state if state["reuse"]["known_turns"] >= 4 else {}

        state = wait_for(served, 240, "no demo turn was answered by the real engine", tolerate=TOLERATE)
        # every turn's cached_tokens came from the engine, and the pool is the engine's own
        assert state["reuse"]["unknown_turns"] == 0 and state["reuse"]["token_weighted"] is not None
        assert state["budgeter"]["pool_tokens"] == POOL_TOKENS

        def collected() -> list[dict]:
            out = subprocess.run(
                [PYTHON, "-m", "collectors", "status", "--json", "--database-url", database],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            rows = json.loads(out)
            engine = [
                r for r in rows if r["target"] == real_engine.url and r["up"] and r["kv_usage"] is not None
            ]
            side = [r for r in rows if r["role"] == "sidecar" and r["up"] and r["token_weighted"] is not None]
            return rows if engine and side else []

        rows = wait_for(
            collected, 120, "the collectors stored no reading of the real engine", tolerate=TOLERATE
        )
        engine_row = next(r for r in rows if r["target"] == real_engine.url)
        assert engine_row["kind"] == "vllm" and engine_row["pool_tokens"] == POOL_TOKENS
        assert engine_row["requests_running"] is not None and engine_row["requests_waiting"] is not None
        assert engine_row["name"] == "vllm-cpu", engine_row

        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 0, read_log(proc)[-3000:]
    # the demo stopped what it started, and left the engine it did not start running
    assert httpx.get(f"{real_engine.url}/health", timeout=10).status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{sidecar}/healthz", timeout=2)
