"""simulator/live_run.py against the project's simulated engine (the real engine's runs are in docs/real-engine.md)."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from core.runs import judge_run
from simulator.agent import SERIES_FIELDS
from simulator.live_run import arrival_times
from simulator.offline import run_scenario, scenario_config
from tests.support import PYTHON, REPO, simulator_and_sidecar


@pytest.mark.parametrize("scenario,seed", [("agent-steady", 0), ("agent-burst", 3), ("agent-burst", 7)])
def test_arrivals_are_the_offline_runs_arrivals(scenario, seed):
    minutes = 12.0
    offline = run_scenario(scenario, "off", seed, minutes)
    live = arrival_times(scenario_config(scenario).agent, seed, minutes * 60)
    assert len(live) == offline["summary"]["sessions_arrived"]
    assert live == sorted(live)


def test_live_run_through_the_sidecar_writes_a_judged_run_json(tmp_path):
    token = "live-run-test-token"
    with simulator_and_sidecar(
        tmp_path,
        engine_args=("--pool-tokens", "20480", "--block-size", "128"),
        sidecar_env={"PREFIXOPS_OPERATOR_TOKEN": token},
    ) as (engine, sidecar):
        done = subprocess.run(
            [
                PYTHON,
                "-m",
                "simulator",
                "live-run",
                "--engine",
                engine,
                "--sidecar",
                sidecar,
                "--scenario",
                "agent-burst",
                "--control",
                "budgeter-park",
                "--control-start-min",
                "0.25",
                "--minutes",
                "0.5",
                "--seed",
                "1",
                "--preset",
                "cpu-tiny",
                "--set",
                "burst_start_min=0.05",
                "--set",
                "burst_minutes=0.1",
                "--operator-token",
                token,
                "--out",
                str(tmp_path / "run"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        audit = httpx.get(f"{sidecar}/audit", timeout=10).text
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert set(SERIES_FIELDS) <= set(run["series"])
    assert len(run["series"]["t"]) == 30
    s = run["series"]
    assert sum(s["turns"]) > 0 and sum(s["prompt_tokens"]) >= sum(s["cached_tokens"]) > 0
    verdict = judge_run(
        s["prompt_tokens"],
        s["cached_tokens"],
        s["turns"],
        s["sessions_in_system"],
        control_start_min=0.25,
        minutes=0.5,
        window_min=1.0,
    ).as_dict()
    assert {k: run["summary"][k] for k in verdict} == verdict
    assert run["config"]["engine"]["pool_tokens"] == 20480  # read from the engine through the sidecar
    assert run["summary"]["sessions_arrived"] == len(run["arrivals"]) > 0
    assert '"budgeter-park"' in audit  # the control switch went through the audited API
    assert (tmp_path / "run" / "run.png").stat().st_size > 0
    # the sidecar's projected demand (core.projection) and the engine's series the collapse-risk replay reads
    # (simulator/live_record.py), one value a second
    assert len(s["projected_demand_tokens"]) == 30 and any(s["projected_demand_tokens"])
    for key in (
        "engine_prompt_tokens",
        "engine_cached_tokens",
        "generation_tokens",
        "preemptions",
        "kv_usage",
    ):
        assert len(s[key]) == 30 and None not in s[key], key
    assert (
        s["engine_prompt_tokens"] == sorted(s["engine_prompt_tokens"]) and s["engine_prompt_tokens"][-1] > 0
    )
    assert s["engine_prompt_tokens"][0] == 0 and s["generation_tokens"][-1] > 0
    # ... and the replay runs on it (simulator live-warning)
    (tmp_path / "fit.json").write_text(json.dumps({"set": {"prefill_per_token_s": "1e-3"}}))
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "simulator",
            "live-warning",
            str(tmp_path / "run"),
            "--fit",
            str(tmp_path / "fit.json"),
            "--out",
            str(tmp_path / "warn"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    warning = json.loads((tmp_path / "warn" / "live-warning.json").read_text())
    row = warning["run_results"][0]
    assert row["prefill_capacity_tokens_per_s"] == 1000.0 and row["capacity_from_fit"]
    assert warning["engine"]["runs"] == warning["sidecar"]["runs"] == 1
