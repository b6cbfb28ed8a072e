"""simulator/fit.py: the least-squares fit, fit.json -> --set values, and `simulator run --fit` (no engine needed)."""

from __future__ import annotations

import json
import subprocess

import pytest

from simulator.config import SimConfigError
from simulator.fit import (
    DECODE_PROBES,
    DECODE_SPAN_S,
    MAX_DECODE_STEPS,
    MIN_DECODE_STEPS,
    PRESETS,
    decode_probes,
    decode_steps,
    fit_from_probes,
    fit_overrides,
    least_squares,
    preset_overrides,
)
from tests.support import PYTHON, REPO

METRICS = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="128",engine="0",kv_cache_size_tokens="20480",'
    'num_gpu_blocks="160"} 1.0\n'
    '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
)


def test_least_squares_recovers_exact_coefficients():
    xs = [[1.0, x, x * x] for x in (1.0, 2.0, 3.0, 5.0)]
    ys = [0.5 + 2.0 * x[1] + 0.25 * x[2] for x in xs]
    assert least_squares(xs, ys) == pytest.approx([0.5, 2.0, 0.25], abs=1e-9)


def test_fit_from_probes_recovers_the_cost_model_and_reads_the_pool():
    t0, alpha, beta, gamma = 0.004, 2e-4, 1e-7, 3e-7
    prefills = [
        {"prompt_tokens": n, "seconds": t0 + alpha * n + beta * n * n / 2} for n in (128, 512, 2048, 8192)
    ]
    decodes = [{"batch": b, "ctx": 1034, "step_s": t0 + gamma * b * 1034} for b in (1, 2, 4, 8)]
    fit = fit_from_probes(METRICS, prefills, decodes)
    s = fit["set"]
    assert s["pool_tokens"] == "20480" and s["block_size"] == "128"
    assert float(s["step_overhead_s"]) == pytest.approx(t0, rel=1e-4)
    assert float(s["prefill_per_token_s"]) == pytest.approx(alpha, rel=1e-4)
    assert float(s["prefill_attention_s"]) == pytest.approx(beta, rel=1e-3)
    assert float(s["decode_per_ctx_token_s"]) == pytest.approx(gamma, rel=1e-4)
    assert all(r["measured_s"] == pytest.approx(r["fitted_s"], abs=1e-4) for r in fit["prefill_residuals"])


def test_a_constant_outside_the_engine_goes_to_the_prefill_intercept_not_to_alpha_and_beta():
    """An HTTP round trip of 2 ms on every prefill probe (simulator fit's module doc)."""
    t0, alpha, beta, gamma, trip = 0.0006, 3.24e-6, 5.57e-10, 3.7e-9, 0.002
    prefills = [
        {"prompt_tokens": n, "seconds": trip + t0 + alpha * n + beta * n * n / 2}
        for n in (200, 745, 1467, 2914, 5765, 11595)
    ]
    decodes = [
        {"batch": b, "ctx": c, "step_s": t0 + gamma * b * c} for b, c in ((1, 1900), (8, 1900), (4, 6200))
    ]
    fit = fit_from_probes(METRICS, prefills, decodes)
    assert float(fit["set"]["prefill_per_token_s"]) == pytest.approx(alpha, rel=1e-4)
    assert float(fit["set"]["prefill_attention_s"]) == pytest.approx(beta, rel=1e-4)
    assert fit["prefill_intercept_s"] == pytest.approx(trip + t0, abs=1e-6)


def test_decode_probes_take_enough_steps_to_outlast_the_timing_of_an_answer():
    assert decode_steps(0.02) == MIN_DECODE_STEPS  # a real engine's 20 ms steps: 64 take 1.3 s
    assert decode_steps(0.0006) == int(DECODE_SPAN_S / 0.0006) + 1 == 1667  # the simulated engine at x10
    assert decode_steps(1e-6) == decode_steps(0.0) == MAX_DECODE_STEPS
    # every probe's batch in half the pool, at 2 tokens a word: none is preempted
    assert decode_probes(400_000, 1667) == DECODE_PROBES
    assert decode_probes(20_480, 64) == ((1, 1024), (4, 1024), (1, 4096))  # the real CPU engine's default
    assert decode_probes(None, 64) == DECODE_PROBES and decode_probes(1000, 64) == ((1, 1024),)


def test_fit_overrides_names_the_file_when_it_is_not_a_fit(tmp_path):
    bad = tmp_path / "fit.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SimConfigError, match="fit.json"):
        fit_overrides(bad)
    with pytest.raises(SimConfigError, match="unknown preset 'nope'"):
        preset_overrides("nope")


def test_simulator_run_with_fit_and_preset_uses_the_fitted_engine(tmp_path):
    fit = {
        "set": {
            "pool_tokens": "20480",
            "block_size": "128",
            "step_overhead_s": "0.004",
            "prefill_per_token_s": "0.0002",
            "prefill_attention_s": "1e-07",
            "decode_per_ctx_token_s": "3e-07",
        }
    }
    (tmp_path / "fit.json").write_text(json.dumps(fit))
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "simulator",
            "run",
            "--scenario",
            "agent-steady",
            "--minutes",
            "2",
            "--preset",
            "cpu-tiny",
            "--fit",
            str(tmp_path / "fit.json"),
            "--set",
            "arrival_rate=0.05",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["config"]["engine"]["pool_tokens"] == 20480 and run["config"]["engine"]["block_size"] == 128
    assert run["config"]["cost"]["prefill_per_token_s"] == pytest.approx(2e-4)
    assert run["config"]["agent"]["turns"] == int(PRESETS["cpu-tiny"]["turns"])
    assert run["config"]["agent"]["arrival_rate"] == 0.05  # the command's own --set wins over the preset
