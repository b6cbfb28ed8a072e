"""Pure helpers of the dashboard: escaping, state precedence, settings, preview adapter."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.budgeter import BudgeterConfig
from dashboard import preview as pv
from dashboard.frames import EngineRef, TargetHealth, combine_ranks
from dashboard.settings import Settings, SettingsError
from dashboard.status import engine_status, last_hit_text
from dashboard.ui import escape_md


@given(st.text())
def test_escape_md_leaves_no_markdown_syntax_active(text: str) -> None:
    escaped = escape_md(text)
    # Every markdown-significant character is preceded by a backslash.
    i = 0
    while i < len(escaped):
        if escaped[i] == "\\":
            i += 2
            continue
        assert escaped[i] not in "*_[]()<>`#|~$:!", escaped
        i += 1


REF = EngineRef(
    key="a", engine_target_id=1, sidecar_target_id=2, engine_url="e", sidecar_url="s", kind="vllm"
)


def health(up: bool = True, age: float = 1.0, now: float = 1000.0) -> dict[int, TargetHealth]:
    return {
        t: TargetHealth(
            t,
            "engine" if t == 1 else "sidecar",
            f"t{t}",
            f"u{t}",
            up if t == 1 else True,
            now - 1,
            now - age,
            None if up else "ConnectError",
            0,
        )
        for t in (1, 2)
    }


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"health": health(up=False), "rules": {"collapse"}, "regime": "thin-reuse"}, "down"),
        ({"health": health(age=100), "rules": {"collapse"}}, "stale"),
        ({"health": health(), "rules": {"collapse"}, "regime": "thin-reuse"}, "collapsed"),
        ({"health": health(), "rules": {"thin-reuse"}, "regime": "thin-reuse"}, "thin-reuse"),
        ({"health": health(), "rules": {"thin-reuse"}}, "thin-reuse"),
        ({"health": health()}, "healthy"),
        ({"health": health(up=False), "collectors_ok": False}, "stale"),
    ],
)
def test_state_precedence(kwargs: dict, expected: str) -> None:
    status = engine_status(
        REF,
        kwargs["health"],
        now=1000.0,
        stale_after=10.0,
        collectors_ok=kwargs.get("collectors_ok", True),
        collectors_age=300.0,
        firing_rules=kwargs.get("rules", set()),
        regime=kwargs.get("regime"),
    )
    assert status.state == expected
    assert status.reason


def test_settings_reject_bad_values_with_the_variable_name() -> None:
    with pytest.raises(SettingsError, match="PREFIXOPS_REFRESH_SECONDS must be a number, got 'fast'"):
        Settings.from_env({"PREFIXOPS_REFRESH_SECONDS": "fast"})
    settings = Settings.from_env({"PREFIXOPS_OPERATOR_ALLOWLIST": "A@x.com, b@y.org"})
    assert settings.operator_allowlist == frozenset({"a@x.com", "b@y.org"})
    assert "token-value" not in repr(Settings.from_env({"PREFIXOPS_OPERATOR_TOKEN": "token-value"}))


def test_combine_ranks_sums_rates_and_recomputes_the_hit_ratio() -> None:
    frame = pd.DataFrame(
        [
            (1.0, 1, "0", "prefix_cache_hits_per_s", 90.0),
            (1.0, 1, "0", "prefix_cache_queries_per_s", 100.0),
            (1.0, 1, "1", "prefix_cache_hits_per_s", 0.0),
            (1.0, 1, "1", "prefix_cache_queries_per_s", 900.0),
            (1.0, 1, "0", "engine_hit_ratio", 0.9),
            (1.0, 1, "1", "engine_hit_ratio", 0.0),
            (1.0, 1, "0", "kv_usage", 0.2),
            (1.0, 1, "1", "kv_usage", 0.4),
        ],
        columns=["ts", "target_id", "engine_label", "signal", "value"],
    )
    out = combine_ranks(frame).set_index("signal")["value"]
    assert out["engine_hit_ratio"] == pytest.approx(0.09)  # 90 / 1000, not the mean 0.45
    assert out["prefix_cache_queries_per_s"] == 1000.0
    assert out["kv_usage"] == pytest.approx(0.3)


def test_preview_adapter_uses_core_budgeter() -> None:
    sessions = pd.DataFrame(
        [
            {
                "session_id": f"s{i}",
                "state": "admitted",
                "context_tokens": 30_000,
                "turns": 3,
                "manual": False,
                "pinned": i == 0,
                "first_seen_ts": float(i),
                "last_seen_ts": 100.0,
                "data": {"admitted_at": float(i), "output_budget": 1000},
            }
            for i in range(4)
        ]
        + [
            {
                "session_id": "w",
                "state": "waiting",
                "context_tokens": 5000,
                "turns": 0,
                "manual": False,
                "pinned": False,
                "first_seen_ts": 50.0,
                "last_seen_ts": 100.0,
                "data": {"output_budget": 1000},
            }
        ]
    )
    state = {"mode": "budgeter-park", "low": 0.75, "high": 0.95, "pool_tokens": 100_000}
    result = pv.preview(state, sessions, BudgeterConfig(low=0.5, high=0.6), now=200.0)
    assert result.would_park == ["s3", "s2", "s1"]  # newest first until under the band; s0 is pinned
    assert result.would_admit == []
    relaxed = pv.preview(state, sessions, BudgeterConfig(mode="off"), now=200.0)
    assert relaxed.would_park == [] and relaxed.would_admit == ["w"]


def test_forecast_fit_file_is_used_only_for_the_engine_it_names(tmp_path) -> None:
    import json

    from dashboard.forecast_view import fit_of

    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"engine": "http://e:8000/", "set": {"prefill_per_token_s": "1e-5"}}))
    assert fit_of(str(path), "http://e:8000") == ({"prefill_per_token_s": "1e-5"}, f"fit file {path}")
    assert fit_of(str(path), "http://other:8000") == (
        None,
        f"the fit file {path} is of http://e:8000/, not http://other:8000",
    )
    assert fit_of(None, "http://e:8000") == (None, "no fit file (PREFIXOPS_FIT unset)")
    path.write_text("{}")
    assert (
        fit_of(str(path), "http://e:8000")[1] == f"PREFIXOPS_FIT={path} is not a `simulator fit` file ('set')"
    )


def test_the_forecast_caption_says_what_the_forecast_ran_on() -> None:
    import dataclasses

    from dashboard.forecast_view import NO_FIT_WARNING, Job, caption
    from simulator.config import CostModel, EngineConfig
    from simulator.forecast import ForecastInputs, Shapes

    inputs = ForecastInputs(
        engine=EngineConfig(pool_tokens=400_000, block_size=16),
        cost=CostModel(),
        cost_source="fit+latencies",
        sessions=(),
        shapes=Shapes(0.5, (1000,), (100,), (10,), (1.0,), (20,), 0, 321),
        output_budget=10,
        turn_overhead_s=0.25,
        turn_overhead_from="e2e_mean",
        cost_estimated=("step_overhead_s", "decode_per_ctx_token_s"),
    )
    job = Job(inputs, (BudgeterConfig(), BudgeterConfig()), 30.0, draws=3, started=100.0, finished=101.5)
    assert caption(job, "fit file f.json") == (
        "30 minutes from 0 sessions as of now, the median of 3 draws of new sessions and turns (their range "
        "in brackets); new sessions at 30.00/min and turn shapes from 321 recorded "
        "turns; pool 400000 tokens in blocks of 16; 0.25 s of each turn's recorded latency outside the "
        "engine's own (against its exact mean latency, over the newest 500 turns); cost model from fit+latencies (fit file f.json; "
        "step_overhead_s, decode_per_ctx_token_s from the recorded latencies); ran in 1.5 s."
    )
    bare = dataclasses.replace(
        inputs, cost_source="latencies", cost_estimated=(), turn_overhead_from="e2e_p50"
    )
    text = caption(dataclasses.replace(job, inputs=bare), "no fit file (PREFIXOPS_FIT unset)")
    assert "(against its median latency, inside histogram buckets: coarse; the newest 500 turns)" in text
    assert text.endswith(f"(no fit file (PREFIXOPS_FIT unset)); {NO_FIT_WARNING}; ran in 1.5 s.")
    assert "now, one draw of new sessions and turns; new" in caption(dataclasses.replace(job, draws=1), "")


def test_a_forecast_cell_is_the_draws_median_with_their_range_when_they_differ() -> None:
    from dashboard.forecast_view import cell

    result = {"summary": {"parked_end": 17, "r_t": 0.9161, "mode": "off"}, "spread": {"parked_end": [15, 34]}}
    assert cell(result, "parked_end") == "17 (15–34)"
    assert cell(result, "r_t") == "0.9161"  # one draw, or no spread recorded
    assert cell({"summary": {"r_t": None}, "spread": {"r_t": [0.5, 0.5]}}, "r_t") == "n/a"


def test_a_subtree_with_no_completed_turn_was_never_hit() -> None:
    # the tracker reports last_seen 0 for a subtree known only from a turn in flight: the Compaction page
    # showed "20788.8 d ago" for it in the rag demo
    now = 1_796_153_000.0
    assert last_hit_text(0.0, now) == "never"
    assert last_hit_text(None, now) == "never"
    assert last_hit_text(float("nan"), now) == "never"
    assert last_hit_text(now - 4.0, now) == "4 s ago"
    assert last_hit_text(now - 600.0, now) == "10 min ago"


def test_the_forecast_says_when_its_start_state_disagrees_with_the_sidecars_counts() -> None:
    import dataclasses

    from dashboard.forecast_view import Job, caption, start_note
    from simulator.config import CostModel, EngineConfig
    from simulator.forecast import ForecastInputs, Shapes, StartSession

    def session(i: int, state: str) -> StartSession:
        return StartSession(f"s{i}", state, 1000, 1)

    inputs = ForecastInputs(
        engine=EngineConfig(pool_tokens=400_000, block_size=16),
        cost=CostModel(),
        cost_source="latencies",
        sessions=tuple(session(i, "admitted" if i < 3 else "parked") for i in range(4)),
        shapes=Shapes(0.5, (1000,), (100,), (10,), (1.0,), (20,), 0, 321),
        output_budget=10,
    )
    job = Job(
        inputs, (BudgeterConfig(), BudgeterConfig()), 30.0, counted={"admitted": 3, "parked": 1, "waiting": 0}
    )
    assert start_note(job) == ""  # they agree
    assert start_note(dataclasses.replace(job, counted=None)) == ""  # no counts: nothing to compare
    behind = dataclasses.replace(job, counted={"admitted": 90, "parked": 12, "waiting": 18})
    assert start_note(behind) == (
        "The preview starts from the collectors' listing of the sidecar's sessions: 3 admitted, 1 parked, "
        "0 waiting. The sidecar itself counts 90 admitted, 12 parked, 18 waiting. The listing has not caught "
        "up, so the preview does not start from the engine's whole backlog."
    )
    assert caption(behind, "").startswith(
        "30 minutes from 4 sessions as of now, "
    )  # the note is a box of its own
