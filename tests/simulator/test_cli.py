"""The offline commands write what issue 3 specifies: run.json fields, table3.json keys, plots, one-line summaries."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support import PYTHON, REPO

SERIES = (
    "t",
    "engine_hit_ratio",
    "token_weighted",
    "request_weighted",
    "turns_per_s",
    "sessions_in_system",
    "parked",
    "kv_usage",
    "demand_tokens",
)
SUMMARY = ("collapsed", "recovered", "minutes_to_recover", "end_hit_ratio", "degraded_at", "wall_s")


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "simulator", *args], cwd=REPO, capture_output=True, text=True, timeout=240
    )


def test_run_writes_series_summary_plot_and_one_line(tmp_path: Path) -> None:
    out = tmp_path / "new" / "dir"
    res = sim(
        "run",
        "--scenario",
        "agent-burst",
        "--control",
        "budgeter-park",
        "--seed",
        "4",
        "--minutes",
        "6",
        "--out",
        str(out),
        "--set",
        "burst_start_min=1",
        "--set",
        "control_start_min=3",
        "--set",
        "pool_tokens=300000",
    )
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.strip().splitlines()) == 1 and "collapsed=" in res.stdout
    data = json.loads((out / "run.json").read_text())
    assert all(len(data["series"][k]) == 360 for k in SERIES)
    assert all(k in data["summary"] for k in SUMMARY)
    assert data["config"]["engine"]["pool_tokens"] == 300000
    assert data["config"]["control"]["control_start_min"] == 3
    assert (out / "run.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_settings_fail_with_a_clear_message(tmp_path: Path) -> None:
    res = sim(
        "run",
        "--scenario",
        "agent-steady",
        "--seed",
        "1",
        "--minutes",
        "1",
        "--out",
        str(tmp_path),
        "--set",
        "no_such_key=3",
    )
    assert res.returncode == 2 and "unknown setting 'no_such_key'" in res.stderr
    res = sim(
        "run",
        "--scenario",
        "agent-steady",
        "--seed",
        "1",
        "--minutes",
        "1",
        "--out",
        str(tmp_path),
        "--set",
        "low_band=0.9",
        "--set",
        "high_band=0.8",
    )
    assert res.returncode == 2 and "low band must be below high band" in res.stderr
    res = sim(
        "run",
        "--scenario",
        "agent-steady",
        "--seed",
        "1",
        "--minutes",
        "1",
        "--out",
        str(tmp_path),
        "--set",
        "turns=many",
    )
    assert res.returncode == 2 and "turns" in res.stderr


def test_table3_writes_the_table_and_its_json(tmp_path: Path) -> None:
    res = sim(
        "table3",
        "--runs",
        "1",
        "--seed-base",
        "5",
        "--minutes",
        "4",
        "--jobs",
        "2",
        "--out",
        str(tmp_path),
        "--set",
        "control_start_min=2",
    )
    assert res.returncode == 0, res.stderr
    data = json.loads((tmp_path / "table3.json").read_text())
    for key in ("pairs", "burst_only_degraded", "steady_only_degraded", "both_degraded"):
        assert isinstance(data[key], int)
    assert data["pairs"] == 1
    for control in (
        "off",
        "admission-only",
        "latency-park",
        "session-cap-park",
        "budgeter-park",
        "budgeter-park (65/85)",
        "budgeter-park (85/98)",
    ):
        row = data[control]
        assert isinstance(row["collapsed_runs"], int) and isinstance(row["recovered_runs"], int)
        assert len(row["minutes_to_recover"]) == len(row["end_hit_ratio"]) == row["collapsed_runs"]
    md = (tmp_path / "table3.md").read_text()
    assert "| control | collapsed runs recovered | time to recover (min) | hit ratio at end |" in md
    assert (tmp_path / "table3.png").exists()
    assert "table3 runs" in res.stderr  # the progress bar


def test_table3_pairs_only_runs_just_the_pairs(tmp_path: Path) -> None:
    res = sim(
        "table3", "--runs", "2", "--minutes", "3", "--jobs", "2", "--pairs-only", "--out", str(tmp_path)
    )
    assert res.returncode == 0, res.stderr
    data = json.loads((tmp_path / "table3.json").read_text())
    assert data["pairs"] == 2 and data["pairs_only"] is True
    assert {r["row"] for r in data["run_summaries"]} == {"pair-steady", "off"}
    assert "| control |" not in (tmp_path / "table3.md").read_text()


def test_compaction_writes_its_table(tmp_path: Path) -> None:
    res = sim(
        "compaction",
        "--runs",
        "1",
        "--minutes",
        "3",
        "--jobs",
        "2",
        "--out",
        str(tmp_path),
        "--set",
        "storm_start_min=1",
        "--set",
        "storm_minutes=1",
    )
    assert res.returncode == 0, res.stderr
    data = json.loads((tmp_path / "compaction.json").read_text())
    for trigger in ("none", "naive", "gate"):
        assert {"compactions", "storm_R_t", "storm_R_r", "storm_D", "R_t_after_compaction"} <= set(
            data[trigger]
        )
    assert data["none"]["compactions"] == [0]
    assert "| trigger |" in (tmp_path / "compaction.md").read_text()
