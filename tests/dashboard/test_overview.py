"""AppTest of the Overview page (issue 2 item 4, issue 6, issue 13 items 1, 2, 9) over a filled database."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
from sqlalchemy import insert, update

from dashboard import fleet, risk
from db import make_engine
from db.models import Alert, CollectorHeartbeat, SidecarState, Target
from tests.dashboard.apptest import app, figures, texts, traces


def table_of(at) -> pd.DataFrame:
    return at.dataframe[0].value.set_index("engine")


def number(cell: float) -> float | None:
    """A number column's cell (a float; NaN is an unknown value, drawn as a blank)."""
    return None if pd.isna(cell) else float(cell)


def test_fleet_table_worst_first_with_cause_next_step_and_counts(db_url: str) -> None:
    at = app()
    table = table_of(at)
    assert list(table.index) == ["c", "a", "b"]  # DOWN > COLLAPSED > healthy
    assert list(table["state"]) == ["DOWN", "COLLAPSED", "healthy"]
    assert "ConnectError" in table.loc["c", "why"] and "Next: check the process" in table.loc["c", "why"]
    assert "collapse" in table.loc["a", "why"] and "Next: park sessions" in table.loc["a", "why"]
    assert number(table.loc["a", "R_t"]) == pytest.approx(0.1, abs=0.05)
    assert number(table.loc["a", "R_r"]) == pytest.approx(0.9, abs=0.05)
    assert number(table.loc["a", "open alerts"]) == 2
    assert number(table.loc["a", "parked"]) == 12
    assert number(table.loc["b", "engine running"]) == 16  # two data-parallel ranks summed
    assert table.loc["a", "open"] == "engine?engine=a"
    counts = {m.label: m.value for m in at.metric}
    assert (counts["DOWN"], counts["COLLAPSED"], counts["healthy"], counts["QUEUEING"]) == (
        "1",
        "1",
        "1",
        "0",
    )
    assert "Needs attention (2)" in texts(at)


def test_an_unknown_value_is_a_blank_with_its_reason_in_the_help(db_url: str) -> None:
    """The fill stores no collapse-risk samples: the risk is blank, "not computed", never "None"."""
    at = app()
    table = table_of(at)
    assert table["risk"].isna().all()
    assert list(table["risk: leading inputs"]) == ["not computed"] * 3
    assert at.dataframe[0].proto.placeholder == ""  # a missing number is drawn blank, not "None"
    assert "Blank: not computed" in risk.RISK_HELP and "not computed: no risk score yet" in risk.LEADING_HELP
    columns = json.loads(at.dataframe[0].proto.columns)
    assert columns["risk"]["help"] == risk.RISK_HELP
    assert columns["risk: leading inputs"]["help"] == risk.LEADING_HELP
    assert all("Blank:" in columns[name]["help"] for name in ("R_t", "demand / pool", "KV usage", "parked"))


def test_number_columns_are_numeric_so_they_sort_as_numbers(db_url: str) -> None:
    """Every number column of the fleet table is a float column (NaN = unknown, drawn blank), so sorting
    it sorts the numbers, negative D values included; each keeps its format and its help."""
    at = app()
    table = table_of(at)
    names = [*fleet.NUMBER_COLUMNS, "risk"]
    assert all(pd.api.types.is_float_dtype(table[name]) for name in names), table[names].dtypes
    columns = json.loads(at.dataframe[0].proto.columns)
    for name in names:
        assert columns[name]["type_config"]["type"] == "number", columns[name]
        assert columns[name]["help"]
    assert columns["demand / pool"]["type_config"]["format"] == "percent"
    assert columns["D"]["type_config"]["format"] == "%.2f"


def test_table_numbers_sorts_negative_and_unknown_values_as_numbers() -> None:
    frame = pd.DataFrame(
        {"D": [0.1, None, -0.25, float("nan"), -1.5], "n": [9, None, 12, 3, 100], "x": list("abcde")}
    )
    out = fleet.table_numbers(frame, ["D", "n", "missing"])
    assert out["D"].dtype == "float64" and out["n"].dtype == "float64" and list(out["x"]) == list("abcde")
    assert list(out.sort_values("D")["x"]) == ["e", "c", "a", "b", "d"]  # NaN last, -1.5 < -0.25 < 0.1
    assert list(out.sort_values("n")["x"]) == ["d", "a", "c", "e", "b"]  # 100 after 12 (text sorted it first)
    assert fleet.column_format("percent") == "percent" and fleet.column_format("%d") == "%d"


def test_each_target_has_its_own_last_good_scrape(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A frozen engine behind a live sidecar: DOWN, and the engine's own age, not the sidecar's."""
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            update(Target)
            .where(Target.name == "b")
            .values(up=False, last_success_ts=time.time() - 300, last_error="ReadTimeout")
        )
    table = table_of(app())
    assert table.loc["b", "state"] == "DOWN"
    assert "engine b not answering: ReadTimeout (its last good scrape 5 min ago)" in table.loc["b", "why"]
    assert table.loc["b", "engine: last good scrape"] == "5 min ago (DOWN)"
    assert "DOWN" not in table.loc["b", "sidecar: last good scrape"]


def test_sessions_waiting_at_the_sidecar_make_the_engine_queueing(db_url: str) -> None:
    engine = make_engine(db_url)
    now = time.time()
    with engine.begin() as conn:
        b_side = conn.execute(Target.__table__.select().where(Target.name == "b-sidecar")).first()
        row = conn.execute(SidecarState.__table__.select().where(SidecarState.target_id == b_side.id)).first()
        state = dict(
            row.state,
            backlog={
                "admitted": 5,
                "parked": 0,
                "waiting": 12,
                "oldest_waiting_s": 80.0,
                "oldest_parked_s": None,
            },
        )
        conn.execute(update(SidecarState).where(SidecarState.target_id == b_side.id).values(state=state))
        conn.execute(
            insert(Alert).values(
                rule="admission-wait",
                target_id=b_side.id,
                engine_label="",
                severity="warning",
                state="firing",
                started_ts=now - 20,
                last_eval_ts=now,
                summary="queue",
                values={"oldest_waiting_s": 80.0},
            )
        )
    at = app()
    table = table_of(at)
    assert table.loc["b", "state"] == "QUEUEING"
    assert number(table.loc["b", "waiting at sidecar"]) == 12 and table.loc["b", "oldest wait"] == "80 s"
    assert "12 sessions waiting at the sidecar, the oldest for 80 s" in table.loc["b", "why"]
    assert "Budgeter page" in table.loc["b", "why"]
    assert list(table.index) == ["c", "a", "b"]


def test_badge_agrees_with_the_numbers_on_its_row(db_url: str) -> None:
    """The sidecar left thin-reuse (D = 0.15) while the alert still waits out its clear time."""
    engine = make_engine(db_url)
    now = time.time()
    with engine.begin() as conn:
        b_side = conn.execute(Target.__table__.select().where(Target.name == "b-sidecar")).first()
        row = conn.execute(SidecarState.__table__.select().where(SidecarState.target_id == b_side.id)).first()
        state = dict(row.state, reuse=dict(row.state["reuse"], divergence=0.15, regime="normal"))
        conn.execute(
            update(SidecarState)
            .where(SidecarState.target_id == b_side.id)
            .values(state=state, regime="normal")
        )
        conn.execute(
            insert(Alert).values(
                rule="thin-reuse",
                target_id=b_side.id,
                engine_label="",
                severity="warning",
                state="firing",
                started_ts=now - 90,
                last_eval_ts=now,
                summary="D",
                values={"divergence": 0.6},
            )
        )
    table = table_of(app())
    assert number(table.loc["b", "D"]) == pytest.approx(0.15)
    assert table.loc["b", "state"] == "healthy"
    assert (
        "alert thin-reuse still firing until D = 0.15 stays below its exit threshold" in table.loc["b", "why"]
    )


def test_filter_by_name_or_label(db_url: str) -> None:
    at = app()
    at.text_input(key="overview_filter").input("b").run()
    assert list(table_of(at).index) == ["b"]
    at.text_input(key="overview_filter").input("no-such-engine").run()
    assert "No engines match the filter." in texts(at)


def test_fleet_charts_are_distributions_with_the_worst_on_top(db_url: str) -> None:
    at = app()
    figs = figures(at)
    assert {
        "overview_hit_rates",
        "overview_divergence",
        "overview_demand",
        "overview_kv",
        "overview_waiting",
    } <= set(figs)
    hit = traces(figs["overview_hit_rates"])
    assert {"median", "p10-p90 of engines", "a", "b"} <= set(hit)
    assert "c" not in hit  # c's engine is down: its frozen sidecar numbers are not "the worst now"
    a_rt = [y for y in hit["a"]["y"] if y is not None]
    assert a_rt[-1] < 0.2 and max(a_rt) > 0.8  # the last hour holds the collapse 30 minutes ago
    assert len(hit) <= 3 + 3  # band, median and at most 3 engines: never one line per engine
    divergence = figs["overview_divergence"]
    assert any(s.get("y0") == 0.5 and s.get("y1") == 0.5 for s in divergence["layout"]["shapes"])


def test_dead_collectors_make_every_engine_stale_and_say_so(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFIXOPS_HEARTBEAT_STALE_SECONDS", "15")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(update(CollectorHeartbeat).values(last_beat_ts=time.time() - 600))
    at = app()
    table = table_of(at)
    assert set(table["state"]) == {"STALE"}
    assert "heartbeat is 10 min ago" in table.loc["a", "why"]
    assert any("NOT RUNNING" in e.value for e in at.sidebar.error)


def test_target_without_recent_scrape_is_stale(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXOPS_STALE_SECONDS", "30")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(update(Target).where(Target.name == "b").values(last_success_ts=time.time() - 120))
        conn.execute(update(Target).where(Target.name == "b-sidecar").values(last_success_ts=time.time() - 5))
    table = table_of(app())
    assert table.loc["b", "state"] == "STALE"
    assert "its last good scrape 2 min ago" in table.loc["b", "why"]


def test_missing_database_gives_a_clear_message(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/none.db")
    at = app()
    assert "No database at" in texts(at)
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("page", [None, "engine", "sessions", "budgeter", "compaction", "alerts", "audit"])
def test_database_without_schema_is_a_message_not_a_traceback(
    tmp_path, monkeypatch: pytest.MonkeyPatch, page: str | None
) -> None:
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()  # a file, but the collectors never created the tables
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/empty.db")
    at = app(page)
    assert not at.exception
    assert "cannot be read right now" in texts(at)
