"""simulator/live_record.py and simulator/live_warning.py without an engine: exact values."""

from __future__ import annotations

import json
import subprocess

import pytest

from core.engine_metrics import EngineSnapshot
from simulator.agent import SERIES_FIELDS
from simulator.live_record import EngineSeries
from simulator.live_warning import judge_live, prefill_capacity
from simulator.offline import run_scenario
from tests.support import PYTHON, REPO


def snap(q: float, h: float, prompt: float | None, pre: float = 0.0) -> EngineSnapshot:
    return EngineSnapshot(
        prefix_cache_queries=q,
        prefix_cache_hits=h,
        prompt_tokens=prompt,
        generation_tokens=2 * q,
        cached_tokens=h,
        preemptions=pre,
        kv_usage=0.5,
        requests_running=2.0,
        requests_waiting=1.0,
    )


def test_engine_series_are_counters_since_the_first_scrape_deltas_per_second_and_gaps():
    series: dict[str, list] = {k: [] for k in SERIES_FIELDS}
    rec = EngineSeries()
    for s in (snap(100, 40, 100), snap(160, 70, 160, 1), None, snap(200, 90, None, 3)):
        rec.append(series, s)
    assert series["engine_prompt_tokens"] == [0, 60, None, None]  # a counter the engine lacks is a gap
    assert series["engine_cached_tokens"] == [0, 30, None, 50]
    assert series["generation_tokens"] == [0, 120, None, 200]
    assert series["preemptions"] == [0, 1, None, 3]
    assert series["engine_queries"] == [0.0, 60, 0.0, 40]  # per second; after a gap, since the last scrape
    assert series["engine_hits"] == [0.0, 30, 0.0, 20]
    assert series["kv_usage"] == [0.5, 0.5, None, 0.5] and series["waiting"] == [1.0, 1.0, None, 1.0]


def test_prefill_capacity_is_the_fitted_miss_rate_at_the_mean_prompt():
    fit = {"set": {"step_overhead_s": "0.5", "prefill_per_token_s": "1e-4", "prefill_attention_s": "2e-8"}}
    # 5000 tokens: 0.5 + 0.5 + 2e-8 * 25e6 / 2 = 1.25 s
    assert prefill_capacity(fit, 5000) == pytest.approx(4000.0)
    with pytest.raises(ValueError, match="not a usable fit"):
        prefill_capacity({"set": {}}, 1000)


def test_the_replay_of_an_offline_run_through_the_live_path_matches_warning_eval():
    """A run of `simulator run` has the live run's series: judge_live replays it with warning_eval's code,
    and the capacity from a fit reaches the risk model (a slower engine warns no later)."""
    result = run_scenario("agent-burst", "off", 3, 30.0, {})
    fast = judge_live(result, None)
    slow = judge_live(result, {"set": {"prefill_per_token_s": "1e-3"}})
    assert fast["capacity_from_fit"] is False and slow["prefill_capacity_tokens_per_s"] == pytest.approx(
        1000.0
    )
    assert fast["onset_s"] == slow["onset_s"] is not None
    for mode in ("sidecar", "engine"):
        assert set(fast[mode]) == {"collapse-risk", "collapse"}
        assert (
            fast[mode]["collapse-risk"] and slow[mode]["collapse-risk"][0] <= fast[mode]["collapse-risk"][0]
        )
    assert slow["sidecar"]["collapse-risk"][0] < fast["sidecar"]["collapse-risk"][0]


def test_live_warning_names_a_bad_fit(tmp_path):
    (tmp_path / "fit.json").write_text(json.dumps({"set": {}}))
    (tmp_path / "run.json").write_text("{}")
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "simulator",
            "live-warning",
            str(tmp_path / "run.json"),
            "--fit",
            str(tmp_path / "fit.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "fit.json" in done.stderr and "not a usable fit" in done.stderr
