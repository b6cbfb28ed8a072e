"""simulator/fit.py: the least-squares fit, fit.json -> --set values, and `simulator run --fit` (no engine needed)."""

from __future__ import annotations

import json
import subprocess

import pytest

from simulator.config import EngineConfig, SimConfigError
from simulator.engine_clock import phase_mean, phase_totals
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
    prefill_chunks,
    preset_overrides,
)
from tests.support import PYTHON, REPO, free_port, running

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
        {"prompt_tokens": n, "seconds": trip + prefill_chunks(n) * t0 + alpha * n + beta * n * n / 2}
        for n in (200, 745, 1467, 2914, 5765, 11595)  # the last in two steps
    ]
    decodes = [
        {"batch": b, "ctx": c, "step_s": t0 + gamma * b * c} for b, c in ((1, 1900), (8, 1900), (4, 6200))
    ]
    fit = fit_from_probes(METRICS, prefills, decodes)
    assert float(fit["set"]["prefill_per_token_s"]) == pytest.approx(alpha, rel=1e-4)
    assert float(fit["set"]["prefill_attention_s"]) == pytest.approx(beta, rel=1e-4)
    assert fit["prefill_intercept_s"] == pytest.approx(trip + t0, abs=1e-6)


def test_the_engine_clock_reads_the_phase_histograms_of_a_real_vllm_page():
    page = (REPO / "tests/fixtures/engine-metrics/vllm-0.33.0-statlogger.prom").read_text()
    totals = phase_totals(page)
    assert totals == {"prefill": (0.7014508247375488, 18.0), "decode": (31.851853132247925, 18.0)}
    # one more request of 0.25 s prefill: its time, exactly; two requests where one was expected: none
    later = {**totals, "prefill": (0.7014508247375488 + 0.25, 19.0)}
    assert phase_mean(totals, later, "prefill", 1) == pytest.approx(0.25, abs=1e-12)
    assert phase_mean(totals, {**totals, "prefill": (1.0, 20.0)}, "prefill", 1) is None
    assert phase_mean(totals, totals, "prefill", 1) is None  # not recorded yet
    # SGLang has neither histogram: the fit falls back to wall time
    assert phase_totals("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n") == {}
    assert phase_mean({}, {}, "decode", 4) is None


def test_a_two_rank_engine_adds_its_ranks():
    page = "".join(
        "# TYPE vllm:request_decode_time_seconds histogram\n" if rank == 0 else "" for rank in (0,)
    ) + "".join(
        f'vllm:request_decode_time_seconds_bucket{{engine="{r}",le="+Inf"}} {n}\n'
        f'vllm:request_decode_time_seconds_count{{engine="{r}"}} {n}\n'
        f'vllm:request_decode_time_seconds_sum{{engine="{r}"}} {s}\n'
        for r, n, s in ((0, 3, 1.5), (1, 5, 2.0))
    )
    assert phase_totals(page) == {"decode": (3.5, 8.0)}


def test_the_fit_takes_the_engine_clock_when_every_probe_has_it_and_charges_each_chunk_its_step():
    """Engine-clock probes with a wall time 2-9 ms slower (a busy machine): the fit is the engine's own,
    exactly, a prompt over one step's token budget prefilled in two steps (two T0)."""
    t0, alpha, beta, gamma = 0.0006, 3.24e-6, 5.57e-10, 3.7e-9
    budget = EngineConfig.max_num_batched_tokens
    assert (prefill_chunks(budget), prefill_chunks(budget + 1), prefill_chunks(0)) == (1, 2, 1)
    prefills = []
    for i, (n, s) in enumerate(((200, 0), (1467, 0), (5765, 0), (11595, 0), (2900, 1450), (2900, 7200))):
        engine = prefill_chunks(n) * t0 + alpha * n + beta * n * (s + n / 2)
        prefills.append(
            {
                "prompt_tokens": n + s,
                "cached_tokens": s,
                "seconds": engine + 0.002 + 0.007 * (i % 2),
                "engine_s": engine,
            }
        )
    decodes = [
        {"batch": b, "ctx": c, "step_s": t0 + gamma * b * c + 0.0004 * b, "engine_step_s": t0 + gamma * b * c}
        for b, c in ((1, 1900), (8, 1900), (4, 6200))
    ]
    fit = fit_from_probes(METRICS, prefills, decodes)
    assert fit["clock"] == {"prefill": "engine", "decode": "engine"}
    s = fit["set"]
    assert float(s["prefill_per_token_s"]) == pytest.approx(alpha, rel=1e-5)
    assert float(s["prefill_attention_s"]) == pytest.approx(beta, rel=1e-5)
    assert float(s["decode_per_ctx_token_s"]) == pytest.approx(gamma, rel=1e-5)
    assert fit["prefill_intercept_s"] == pytest.approx(t0, abs=1e-6)
    # one probe without the engine's time: the whole fit is on wall time (one clock, one intercept)
    prefills[2] = {**prefills[2], "engine_s": None}
    fit = fit_from_probes(METRICS, prefills, decodes)
    assert fit["clock"]["prefill"] == "wall"
    assert fit["prefill_residuals"][0]["measured_s"] == round(prefills[0]["seconds"], 4)


def test_simulator_fit_of_a_simulated_engine_is_its_own_cost_model(tmp_path):
    """``simulator fit`` against the simulated engine at x10 (the demo's speed): timed by the engine's
    clock, every term within 1% of the engine's own, in wall seconds (sim seconds / 10)."""
    port = free_port()
    cmd = [PYTHON, "-m", "simulator", "serve", "--port", str(port), "--speed", "10", "--seed", "4"]
    with running(cmd, name="simulator", ready_url=f"http://127.0.0.1:{port}/health"):
        done = subprocess.run(
            [
                PYTHON,
                "-m",
                "simulator",
                "fit",
                "--engine",
                f"http://127.0.0.1:{port}",
                "--out",
                str(tmp_path / "fit.json"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert fit["clock"] == {"prefill": "engine", "decode": "engine"}
    own = {
        "step_overhead_s": 0.0006,
        "prefill_per_token_s": 3.24e-6,
        "prefill_attention_s": 5.57e-10,
        "decode_per_ctx_token_s": 3.7e-9,
    }
    assert {k: float(fit["set"][k]) for k in own} == pytest.approx(own, rel=0.01)
    assert fit["set"]["pool_tokens"] == "400000"


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
