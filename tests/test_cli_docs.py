"""docs/cli.md is generated from the commands' own --help: this fails when the two drift."""

from __future__ import annotations

import subprocess

from tests.support import PYTHON, REPO


def test_cli_reference_matches_every_commands_help() -> None:
    done = subprocess.run(
        [PYTHON, "scripts/gen_cli_docs.py", "--check"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr
