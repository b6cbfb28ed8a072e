"""The demo's processes: each started in its own session with its output in ``DATA_DIR/logs/NAME.log``,
waited for on its readiness URL, stopped with its whole process group, and its log's tail at hand when it
dies (``python -m demo`` restarts a dead one a few times at most, see ``demo.__main__``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
MAX_RESTARTS = 3


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
        self.proc = subprocess.Popen(
            self.cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
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
            raise RuntimeError(
                f"{service.name} exited with code {service.proc.returncode} while starting:\n{service.tail()}"
            )
        try:
            if httpx.get(service.ready_url or "", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(
        f"{service.name} did not answer {service.ready_url} within {timeout:.0f} s:\n{service.tail()}"
    )


def wait_url(url: str, timeout: float, what: str) -> None:
    """Wait for ``url`` to answer 200 (a process the demo did not start: nothing to watch but the URL)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not answer {url} within {timeout:.0f} s")
