"""Debian's Prometheus tools for the tests: `require_binary` finds `promtool`, `prometheus`,
`prometheus-alertmanager` or `amtool` (skip with the reason when missing, except under CI=true where the
test fails), and `prometheus_server` / `alertmanager_server` start the real servers on free loopback
ports with throwaway storage."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support import free_port, running, unavailable


def require_binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found:
        return found
    package = "prometheus-alertmanager" if "alertmanager" in name or name == "amtool" else "prometheus"
    reason = f"{name} is not installed (Debian package {package}; `make test` installs it when it can)"
    unavailable("Prometheus tests", reason)


@contextlib.contextmanager
def prometheus_server(config_yaml: str, rule_files: dict[str, str] | None = None) -> Iterator[str]:
    """A real Prometheus on a free loopback port; yields its base URL. `config_yaml` may use the rule
    file names given in `rule_files` (written next to it)."""
    binary = require_binary("prometheus")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="prefixops-prom-") as tmp:
        root = Path(tmp)
        for name, text in (rule_files or {}).items():
            (root / name).write_text(text)
        (root / "prometheus.yml").write_text(config_yaml)
        cmd = [
            binary,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ]
        with running(
            cmd, name="prometheus", ready_url=f"http://127.0.0.1:{port}/-/ready", cwd=root, timeout=60
        ):
            yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def alertmanager_server(config_yaml: str) -> Iterator[str]:
    binary = require_binary("prometheus-alertmanager")
    port, cluster = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="prefixops-am-") as tmp:
        root = Path(tmp)
        (root / "alertmanager.yml").write_text(config_yaml)
        cmd = [
            binary,
            f"--config.file={root / 'alertmanager.yml'}",
            f"--storage.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--cluster.listen-address=127.0.0.1:{cluster}",
            "--log.level=warn",
        ]
        with running(
            cmd, name="alertmanager", ready_url=f"http://127.0.0.1:{port}/-/ready", cwd=root, timeout=60
        ):
            yield f"http://127.0.0.1:{port}"


def run_tool(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
