"""The demo load generator: closed-loop sessions reach the engine, and a failing target never crashes it."""

from __future__ import annotations

import subprocess

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import PYTHON, REPO, free_port, running


def _value(text: str, name: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return float(s.value)
    raise AssertionError(f"{name} not exported")


def test_sessions_flow_and_reuse_their_prefixes() -> None:
    port = free_port()
    with running(
        [PYTHON, "-m", "simulator", "serve", "--port", str(port), "--speed", "50"],
        name="simulator",
        ready_url=f"http://127.0.0.1:{port}/health",
    ):
        out = subprocess.run(
            [
                PYTHON,
                "-m",
                "simulator",
                "loadgen",
                "--target",
                f"http://127.0.0.1:{port}",
                "--speed",
                "50",
                "--sessions-per-s",
                "4",
                "--max-sessions",
                "4",
                "--turns",
                "3",
                "--duration",
                "4",
                "--seed",
                "1",
                "--rag-rate",
                "2",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert "Traceback" not in out.stderr
    assert "stopped:" in out.stderr
    queries = _value(metrics, "vllm:prefix_cache_queries_total")
    hits = _value(metrics, "vllm:prefix_cache_hits_total")
    assert queries > 0 and hits / queries > 0.3  # later turns and RAG requests reuse shared prefixes


def test_a_dead_target_is_logged_one_line_per_failure_and_never_crashes() -> None:
    port = free_port()  # nothing listens there
    out = subprocess.run(
        [
            PYTHON,
            "-m",
            "simulator",
            "loadgen",
            "--target",
            f"http://127.0.0.1:{port}",
            "--sessions-per-s",
            "5",
            "--duration",
            "2.5",
            "--seed",
            "2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    failures = [line for line in out.stderr.splitlines() if "attempt" in line and "failed" in line]
    assert failures and all("ConnectError" in line or "connect" in line.lower() for line in failures)


def test_http_errors_from_the_target_are_retried(tmp_path) -> None:
    port = free_port()
    # a server that answers every POST with 501: the generator must log and retry, not crash
    with running(
        [PYTHON, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        name="http.server",
        ready_url=f"http://127.0.0.1:{port}/",
    ):
        out = subprocess.run(
            [
                PYTHON,
                "-m",
                "simulator",
                "loadgen",
                "--target",
                f"http://127.0.0.1:{port}",
                "--sessions-per-s",
                "5",
                "--duration",
                "2.5",
                "--model",
                "m",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert any("HTTP 501" in line for line in out.stderr.splitlines())
