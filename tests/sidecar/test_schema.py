"""A bounded, deterministic schemathesis run (its CLI) against the live sidecar with an operator token: no 5xx.

schemathesis's pytest integration does not load under pytest 9.2 (``'Function' object has no
attribute '_nodeid'``), so the suite runs the CLI against a real sidecar process.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx

from .test_process import OPERATOR, sidecar_process, stub_engine

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))


def test_schemathesis_finds_no_server_errors(tmp_path: Path) -> None:
    with (
        stub_engine() as engine,
        sidecar_process(engine, tmp_path / "s.db", "--pool-tokens", "100000", "--max-hold", "2") as (base, _),
    ):
        # a live session under the id the schema's examples use, so session operations get past 404
        assert (
            httpx.post(
                f"{base}/v1/chat/completions",
                headers={"X-Session-Id": "agent-1"},
                json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]},
                timeout=30,
            ).status_code
            == 200
        )
        cmd = [
            SCHEMATHESIS,
            "run",
            f"{base}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "10",
            "--seed",
            "20261129",
            "--generation-deterministic",
            "--no-shrink",
            "--phases",
            "examples,coverage,fuzzing",
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "-H",
            f"Authorization: Bearer {OPERATOR}",
            "-H",
            "X-Actor: schemathesis",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path / "report"),
        ]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-6000:]
        summary = re.search(r"(\d+) generated, (\d+) passed", output)
        assert summary and summary.group(1) == summary.group(2) and int(summary.group(1)) > 100, output[
            -3000:
        ]
        assert "Examples" in output and "Coverage" in output and "Fuzzing" in output
