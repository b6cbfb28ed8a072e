"""dashboard.risk: the Overview's risk column (sidecar key, or the worst label of a bare engine) and the
Engine page's risk timeline and leading inputs, from stored samples."""

from __future__ import annotations

import pandas as pd

from core import signals as sig
from dashboard import risk
from dashboard.frames import EngineRef, Latest

FRONTED = EngineRef("a", 1, 2, "http://e", "http://s", "vllm")
BARE = EngineRef("b", 3, None, "http://b", None, "vllm")


def test_overview_column_reads_the_sidecar_key_or_the_worst_label_of_a_bare_engine():
    latest = Latest(
        {
            (2, "", sig.COLLAPSE_RISK): (10.0, 0.72),
            (2, "", "risk_kv_demand"): (10.0, 0.42),
            (2, "", "risk_demand_trend"): (10.0, 0.3),
            (2, "", "risk_rt_trend"): (10.0, 0.0),
            (1, "0", sig.COLLAPSE_RISK): (10.0, 0.99),  # a fronted engine's own score is not the one shown
            (3, "0", sig.COLLAPSE_RISK): (10.0, 0.2),
            (3, "0", "risk_queue"): (10.0, 0.2),
            (3, "1", sig.COLLAPSE_RISK): (10.0, 0.65),
            (3, "1", "risk_kv_usage"): (10.0, 0.5),
            (3, "1", "risk_preemptions"): (10.0, 0.15),
        }
    )
    rows = [
        {"ref": FRONTED, "engine": "a", "state": "OK", "why": "x", "R_t": 0.9},
        {"ref": BARE, "engine": "b", "state": "OK", "why": "y", "R_t": None},
        {"ref": EngineRef("c", 4, None, "http://c", None, "vllm"), "engine": "c", "state": "OK", "why": "z"},
    ]
    risk.add_columns(rows, latest)
    assert list(rows[0])[:6] == ["ref", "engine", "state", "why", "risk", "risk: leading inputs"]
    assert rows[0]["risk"] == 0.72 and rows[0]["risk: leading inputs"] == "kv_demand, demand_trend"
    assert rows[1]["risk"] == 0.65 and rows[1]["risk: leading inputs"] == "kv_usage, preemptions"
    assert rows[2]["risk"] is None and rows[2]["risk: leading inputs"] == "not computed"


def frame(rows: list[tuple[float, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"ts": t, "target_id": 2, "engine_label": "", "signal": s, "value": v} for t, s, v in rows]
    )


def test_timeline_stacks_the_inputs_under_pressure_and_draws_the_score_and_thresholds():
    f = frame(
        [
            (t, s, v)
            for t in (100.0, 101.0, 102.0)
            for s, v in (
                (sig.COLLAPSE_RISK, 0.7),
                ("risk_kv_demand", 0.4),
                ("risk_demand_trend", 0.3),
                ("risk_rt_trend", 0.0),
            )
        ]
    )
    fig = risk.timeline_figure(f, start=90.0, end=110.0, max_gap=5.0)
    names = [t.name for t in fig.data]
    assert names == ["kv_demand", "demand_trend", "risk score"]  # an input never under pressure is left out
    assert all(t.stackgroup == "inputs" for t in fig.data[:2]) and fig.data[2].stackgroup is None
    assert [s["y0"] for s in fig.layout.shapes] == [0.6, 0.35]
    table = risk.leading_table(f)
    assert list(table["input"]) == ["kv_demand", "demand_trend"]
    assert table["why"][0].startswith("lasting KV demand of admitted sessions")


def test_empty_frames():
    empty = frame([])
    assert risk.leading_table(empty).empty
    assert [t.name for t in risk.timeline_figure(empty, start=0.0, end=1.0, max_gap=5.0).data] == []
