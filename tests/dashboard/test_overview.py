"""AppTest of the Overview page (issue 2 item 4, issue 6 Overview) over a filled database."""

from __future__ import annotations

import time

import pandas as pd
import pytest
from sqlalchemy import update

from db import make_engine
from db.models import CollectorHeartbeat, Target
from tests.dashboard.apptest import app, figures, texts, traces


def test_fleet_table_shows_each_engine_state_with_its_reason(db_url: str) -> None:
    at = app()
    table = at.dataframe[0].value.set_index("engine")
    assert table.loc["a", "state"] == "COLLAPSED"
    assert "collapse" in table.loc["a", "why"]
    assert table.loc["b", "state"] == "healthy"
    assert table.loc["c", "state"] == "DOWN"
    assert "ConnectError" in table.loc["c", "why"]
    assert table.loc["a", "R_t"] == pytest.approx(0.1, abs=0.05)
    assert table.loc["a", "R_r"] == pytest.approx(0.9, abs=0.05)
    assert table.loc["a", "open alerts"] == 2
    assert table.loc["a", "parked"] == 12
    # Engine b's two data-parallel ranks are summed in the row and listed in an expander.
    assert table.loc["b", "running"] == 16
    assert any("ranks of engine b" in e.label for e in at.expander)


def test_hit_rate_chart_plots_r_t_and_r_r_per_engine_with_data(db_url: str) -> None:
    at = app()
    figs = figures(at)
    hit = traces(figs["overview_hit_rates"])
    assert {"a R_t", "a R_r", "b R_t", "b R_r"} <= set(hit)
    a_rt = [y for y in hit["a R_t"]["y"] if y is not None]
    a_rr = [y for y in hit["a R_r"]["y"] if y is not None]
    assert len(a_rt) > 100 and max(a_rt) < 0.2  # collapsed for the whole last 15 minutes
    assert min(a_rr) > 0.8
    divergence = figs["overview_divergence"]
    assert any(s.get("y0") == 0.5 and s.get("y1") == 0.5 for s in divergence["layout"]["shapes"])
    assert {"overview_kv", "overview_requests", "overview_demand"} <= set(figs)


def test_engine_that_stopped_answering_is_drawn_as_stale_data(db_url: str, fill_now: float,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Fresh means "newer than a minute before the fill" however long ago the fill ran.
    monkeypatch.setenv("PREFIXOPS_STALE_SECONDS", str(time.time() - fill_now + 60))
    at = app()
    fig = figures(at)["overview_hit_rates"]
    hit = traces(fig)
    # Engine c's data stops 10 minutes before now: its line ends there, it is labelled, not bridged.
    last_c = pd.Timestamp(hit["c R_t"]["x"][-1])
    last_a = pd.Timestamp(hit["a R_t"]["x"][-1])
    assert (last_a - last_c).total_seconds() > 9 * 60
    assert any(a["text"].startswith("c: no data since") for a in fig["layout"]["annotations"])
    assert not any(a["text"].startswith("a: no data since") for a in fig["layout"]["annotations"])
    at.segmented_control(key="overview_range").set_value("1h").run()
    assert len(traces(figures(at)["overview_hit_rates"])["c R_t"]["x"]) > len(hit["c R_t"]["x"])


def test_dead_collectors_make_every_engine_stale_and_say_so(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXOPS_HEARTBEAT_STALE_SECONDS", "15")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(update(CollectorHeartbeat).values(last_beat_ts=time.time() - 600))
    at = app()
    table = at.dataframe[0].value.set_index("engine")
    assert set(table["state"]) == {"STALE"}
    assert "heartbeat is 10 min ago" in table.loc["a", "why"]
    assert any("NOT RUNNING" in e.value for e in at.sidebar.error)


def test_target_without_recent_scrape_is_stale(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXOPS_STALE_SECONDS", "30")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(update(Target).where(Target.name == "b").values(last_success_ts=time.time() - 120))
    table = app().dataframe[0].value.set_index("engine")
    assert table.loc["b", "state"] == "STALE"
    assert "last good scrape 2 min ago" in table.loc["b", "why"]


def test_missing_database_gives_a_clear_message(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/none.db")
    at = app()
    assert "No database at" in texts(at)
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("page", [None, "engine", "sessions", "budgeter", "compaction", "alerts", "audit"])
def test_database_without_schema_is_a_message_not_a_traceback(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                              page: str | None) -> None:
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()  # a file, but the collectors never created the tables
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/empty.db")
    at = app(page)
    assert not at.exception
    assert "cannot be read right now" in texts(at)
