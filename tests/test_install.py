"""`pip install -e .` gives the four commands, and they work from any directory.

The fresh venv borrows the test venv's installed requirements through a .pth file (so nothing is
downloaded), then installs this project into it in editable mode without build isolation.
"""

from __future__ import annotations

import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support import REPO

COMMANDS = ["prefixops-sidecar", "prefixops-collectors", "prefixops-sim"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()] or [sysconfig.get_paths()["purelib"]]
    (purelib / "borrowed-test-deps.pth").write_text("\n".join(ours) + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-e",
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return venv / "bin"


@pytest.mark.parametrize("command", COMMANDS)
def test_console_script_runs_from_any_directory(installed: Path, command: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(installed / command), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_dashboard_command_finds_the_app_and_its_config_from_elsewhere(
    installed: Path, tmp_path: Path
) -> None:
    code = (
        "import dashboard.launch as l, sys; cmd = l.command([]); env = l.config_env("
        "__import__('tomllib').loads(l.CONFIG.read_text()));"
        "print(cmd[-1]); print(env['STREAMLIT_SERVER_ADDRESS'], env['STREAMLIT_BROWSER_GATHERUSAGESTATS'])"
    )
    done = subprocess.run(
        [str(installed / "python"), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    app, settings = done.stdout.splitlines()
    assert Path(app) == REPO / "app.py"
    assert settings == "127.0.0.1 false"
    assert (installed / "prefixops-dashboard").exists()
