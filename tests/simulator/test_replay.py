"""simulator replay: export an incident bundle, open it, replay it under budgeter-park from a moment."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from collectors.__main__ import main as collectors_main
from collectors.incident import read_bundle, write_bundle
from core.budgeter import BudgeterConfig
from core.runs import RunVerdict
from simulator.__main__ import main as simulator_main
from simulator.forecast_draws import draws_for
from simulator.replay import replay, replay_inputs
from tests.dashboard.fill import COLLAPSE_AGO, filled_engine


@pytest.fixture
def bundle(tmp_path: Path) -> tuple[Path, float]:
    url = f"sqlite:///{tmp_path / 'filled.db'}"
    engine, now = filled_engine(url)
    engine.dispose()
    out = tmp_path / "incident.json.gz"
    assert (
        collectors_main(
            [
                "export-incident",
                "--engine",
                "a",
                "--from",
                str(now - 3600),
                "--to",
                str(now - 600),
                "--out",
                str(out),
                "--database-url",
                url,
            ]
        )
        == 0
    )
    doc = read_bundle(out)
    # The filled engine reports TTFT but not the decode latencies a cost model needs: add what a vLLM reports.
    eng = next(t["url"] for t in doc["targets"] if t["role"] == "engine")
    ts = [s for s in doc["series"] if s["target"] == eng and s["signal"] == "requests_running"][0]["ts"]
    for signal, value in (
        ("itl_p50", lambda i: 0.02 + 0.00001 * (i % 7)),
        ("prompt_len_p50", lambda i: 6000.0),
        ("queue_time_p50", lambda i: 0.0),
    ):
        doc["series"].append(
            {
                "target": eng,
                "engine": None,
                "signal": signal,
                "ts": ts,
                "value": [value(i) for i in range(len(ts))],
            }
        )
    write_bundle(doc, out)
    return out, now


def test_export_open_replay_gives_the_run_summary_fields(
    bundle: tuple[Path, float], capsys: pytest.CaptureFixture[str]
) -> None:
    path, now = bundle
    at = now - COLLAPSE_AGO
    assert (
        simulator_main(
            ["replay", str(path), "--control", "budgeter-park", "--at", str(at), "--minutes", "10"]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert {f.name for f in fields(RunVerdict)} <= set(summary)
    assert (
        summary["control"] == "budgeter-park" and summary["mode"] == "budgeter-park" and summary["at"] == at
    )
    assert (
        0 <= summary["r_t"] <= 1
        and summary["sessions_at_start"] == 12
        and summary["cost_source"] == "latencies"
    )
    # the filled engine has no e2e latency: nothing outside the engine's clock to put in, and it says so
    assert (summary["turn_overhead_s"], summary["turn_overhead_from"]) == (0.0, "none")
    assert (
        summary["recorded_r_t"] is not None and summary["recorded_r_t"] < 0.5
    )  # what the bundle saw: collapse
    off = replay(read_bundle(path), "off", at, minutes=10)["summary"]
    assert off["parked_max"] == 0 and off["mode"] == "off"


def test_replay_errors_name_the_problem(
    bundle: tuple[Path, float], capsys: pytest.CaptureFixture[str]
) -> None:
    path, now = bundle
    assert simulator_main(["replay", str(path), "--control", "budgeter-park", "--at", str(now)]) == 2
    assert "outside the bundle's range" in capsys.readouterr().err


def test_replay_puts_in_the_latency_outside_the_engine_from_the_bundles_exact_means(
    bundle: tuple[Path, float],
) -> None:
    path, now = bundle
    at = now - COLLAPSE_AGO
    doc = read_bundle(path)
    eng = next(t["url"] for t in doc["targets"] if t["role"] == "engine")
    ts = [s for s in doc["series"] if s["target"] == eng and s["signal"] == "requests_running"][0]["ts"]
    doc["series"].append(
        {"target": eng, "engine": None, "signal": "e2e_mean", "ts": ts, "value": [0.25] * len(ts)}
    )
    inputs = replay_inputs(doc, at, BudgeterConfig(mode="budgeter-park"))
    first = min(t for t in ts if t <= at)
    paired = [
        t["latency_s"]
        for t in doc["turns"]
        if t["outcome"] == "ok" and first < t["ts"] <= max(t for t in ts if t <= at)
    ]
    assert inputs.turn_overhead_from == "e2e_mean"
    assert inputs.turn_overhead_s == pytest.approx(max(0.0, sum(paired) / len(paired) - 0.25))


def test_replay_gives_each_session_the_budget_its_client_declared_and_takes_the_previews_draws(
    bundle: tuple[Path, float],
) -> None:
    path, now = bundle
    at = now - COLLAPSE_AGO
    doc = read_bundle(path)
    # the bundle holds the sessions the sidecars saw, with their declared output budgets, and no secrets
    assert doc["sessions"] and {s["output_budget"] for s in doc["sessions"]} == {1024}
    assert set(doc["sessions"][0]) == {
        "target",
        "session_id",
        "first_seen_ts",
        "last_seen_ts",
        "output_budget",
    }
    for s in doc["sessions"]:
        s["output_budget"] = 150 + (s["session_id"] == "agent-010") * 50
    inputs = replay_inputs(doc, at, BudgeterConfig(mode="budgeter-park"))
    declared = {s.id: s.output_budget for s in inputs.sessions}
    assert declared and set(declared.values()) <= {150, 200}
    assert set(inputs.output_budgets) == {150, 200} and inputs.output_budget == 1024  # the default, for none
    # each admitted when it was first seen, or its first recorded turn arrived (the budgeter parks the
    # most recently admitted first), whichever is earlier
    first_turn = {}
    for t in sorted(doc["turns"], key=lambda t: t["ts"]):
        if t["outcome"] == "ok" and t["ts"] <= at:
            first_turn.setdefault(t["session_id"], t["ts"] - t["latency_s"] - (t["held_s"] or 0.0))
    seen = {r["session_id"]: r["first_seen_ts"] for r in doc["sessions"]}
    for s in inputs.sessions:
        began = min(first_turn[s.id], seen.get(s.id) or first_turn[s.id])
        assert s.admitted_for_s == pytest.approx(at - began) and s.arrived_for_s == s.admitted_for_s
    assert len({round(s.admitted_for_s or 0, 3) for s in inputs.sessions}) > 1
    # a bundle written before sessions were exported: the default for every session
    old = {k: v for k, v in doc.items() if k != "sessions"}
    assert replay_inputs(old, at, BudgeterConfig(mode="budgeter-park")).output_budgets == ()
    result = replay(doc, "budgeter-park", at, minutes=10)
    assert result["summary"]["draws"] == draws_for(10) == 5
    low, high = result["spread"]["r_t"]
    assert low <= result["summary"]["r_t"] <= high
