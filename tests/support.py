"""Helpers for tests that start the project's real processes on loopback ports.

Every integration and browser test starts processes through `running()`, so a
process that fails to come up reports its own output instead of a bare timeout,
and every process is stopped when the test ends, even on failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
FIXTURES = REPO / "tests" / "fixtures"
ENGINE_METRICS = FIXTURES / "engine-metrics"
ARTIFACTS = REPO / "artifacts"


T = TypeVar("T")


class FakeClock:
    """A clock for code that takes one (``clock()`` -> seconds); tests move it with ``advance``."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    interval: float = 0.2,
    tolerate: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Exceptions of the ``tolerate`` types count as "not yet" (a server still starting). On time-out
    it fails naming ``what`` and the last value or exception seen, so the report says how far it got.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
            if last:
                return last
        except tolerate as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last seen: {last!r})")
        time.sleep(interval)


def unavailable(what: str, reason: str) -> None:
    """A system dependency is missing: skip with the reason, except under CI=true, where it fails."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} must run under CI=true: {reason}")
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(
    url: str,
    timeout: float = 30.0,
    *,
    proc: subprocess.Popen | None = None,
    expect_text: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Poll `url` until it answers 200 (and contains `expect_text` when given).

    Raises RuntimeError early when `proc` exits before the URL answers.
    """
    deadline = time.monotonic() + timeout
    last_error = "no attempt made"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before {url} answered")
        try:
            response = httpx.get(url, timeout=2.0, headers=dict(headers or {}))
            if response.status_code == 200 and (expect_text is None or expect_text in response.text):
                return
            last_error = f"HTTP {response.status_code}: {response.text[:200]!r}"
        except httpx.HTTPError as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s (last: {last_error})")


def _stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


@contextlib.contextmanager
def running(
    cmd: list[str],
    *,
    name: str,
    ready_url: str | None = None,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    expect_text: str | None = None,
    log_dir: Path | None = None,
) -> Iterator[subprocess.Popen]:
    """Start `cmd` in its own process group, wait until `ready_url` answers, stop it on exit.

    The process's stdout and stderr go to a temporary log; when start-up fails
    or the body raises, the tail of that log is attached to the error so the
    cause is visible in the test report. ``log_dir``: where the process writes
    its own children's logs (the demo's services); each ``*.log`` there has
    its tail attached too.
    """
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    with tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(
            cmd,
            cwd=str(cwd or REPO),
            env=full_env,
            # Never the test's own stdin: under xdist that is the worker's channel to the controller,
            # and a child reading it (a prompt, a REPL) takes the worker down.
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        try:
            if ready_url is not None:
                wait_http(ready_url, timeout, proc=proc, expect_text=expect_text)
            yield proc
        except BaseException as exc:
            _stop(proc)
            log.flush()
            tail = Path(log.name).read_text(errors="replace")[-4000:]
            exc.add_note(f"--- last output of {name} ({' '.join(cmd)}) ---\n{tail}")
            for child_log in sorted(log_dir.glob("*.log")) if log_dir is not None else ():
                exc.add_note(f"--- last output of {child_log} ---\n{_tail(child_log)}")
            raise
        finally:
            _stop(proc)


def _tail(path: Path, chars: int = 3000) -> str:
    """The end of a log, its lines of HTTP access records left out (they bury what went wrong)."""
    lines = path.read_text(errors="replace").splitlines()
    kept = [line for line in lines if not re.search(r'" \d{3}( [A-Za-z ]+)?$', line)]
    return "\n".join(kept)[-chars:]


class NotYet:
    """A ``wait_for`` predicate's "not yet" that says how far it got: falsy, and shown in the time-out."""

    def __init__(self, seen: object) -> None:
        self.seen = seen

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"not yet: {self.seen!r}"


def read_log(proc: subprocess.Popen) -> str:
    """Everything a process started by `running` has printed so far."""
    return Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]


@contextlib.contextmanager
def simulator_and_sidecar(
    state_dir: Path,
    *,
    engine_args: tuple[str, ...] = (),
    sidecar_args: tuple[str, ...] = (),
    sidecar_env: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, str]]:
    """`python -m simulator serve` and `python -m sidecar` in front of it, each on a free loopback port.

    Yields ``(engine_url, sidecar_url)`` once both answer; the sidecar keeps its state in
    ``state_dir / "sidecar.db"``. Extra command-line arguments go to each process as given.
    """
    engine_port, sidecar_port = free_port(), free_port()
    engine, sidecar = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{sidecar_port}"
    engine_cmd = [PYTHON, "-m", "simulator", "serve", "--port", str(engine_port), *engine_args]
    sidecar_cmd = [PYTHON, "-m", "sidecar", "--engine", engine, "--port", str(sidecar_port)]
    sidecar_cmd += ["--state-db", str(state_dir / "sidecar.db"), *sidecar_args]
    with (
        running(engine_cmd, name="simulator", ready_url=f"{engine}/health"),
        running(sidecar_cmd, name="sidecar", ready_url=f"{sidecar}/healthz", env=sidecar_env),
    ):
        yield engine, sidecar
