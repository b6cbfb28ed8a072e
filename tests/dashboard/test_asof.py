"""A paused view (``?to=``) shows the state as of the paused time, never the latest: the as-of reads
(`db.queries.latest_samples(as_of=)`, `up_as_of`, `dashboard.frames` over them) with exact values, and the
paused Overview and Compaction pages."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine, insert
from streamlit.testing.v1 import AppTest

from dashboard import asof
from dashboard import frames as q
from db import make_engine
from db import queries as dbq
from db.models import Base, Sample, Series, Target
from tests.dashboard.apptest import app, texts
from tests.dashboard.conftest import APP
from tests.dashboard.fill import COLLAPSE_AGO, RAW_SECONDS, RAW_STEP, sidecar_signals


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Engine]:
    """One sidecar: R_t 0.9 at t=100, 0.2 at t=200 (the latest); up at 100, down at 200 and 300;
    thin_reuse 0 at 100, 1 at 200."""
    eng = make_engine(f"sqlite:///{tmp_path / 'small.db'}")
    Base.metadata.create_all(eng)
    with eng.begin() as conn:
        conn.execute(
            insert(Target),
            [{"id": 1, "url": "http://s", "role": "sidecar", "name": "s", "up": False, "created_ts": 1.0}],
        )
        conn.execute(
            insert(Series),
            [
                {"id": 1, "target_id": 1, "engine_label": "", "signal": "token_weighted"},
                {"id": 2, "target_id": 1, "engine_label": "", "signal": "up"},
                {"id": 3, "target_id": 1, "engine_label": "", "signal": "thin_reuse"},
            ],
        )
        conn.execute(
            insert(Sample),
            [
                {"series_id": 1, "ts": 100.0, "value": 0.9},
                {"series_id": 1, "ts": 200.0, "value": 0.2},
                {"series_id": 2, "ts": 100.0, "value": 1.0},
                {"series_id": 2, "ts": 200.0, "value": 0.0},
                {"series_id": 2, "ts": 300.0, "value": 0.0},
                {"series_id": 3, "ts": 100.0, "value": 0.0},
                {"series_id": 3, "ts": 200.0, "value": 1.0},
            ],
        )
    yield eng
    eng.dispose()


def test_latest_as_of_reads_the_sample_of_that_time_not_the_newest(small: Engine) -> None:
    with small.connect() as conn:
        now = q.latest(conn, [1], ["token_weighted"])
        then = q.latest(conn, [1], ["token_weighted"], as_of=150.0)
        exact = q.latest(conn, [1], ["token_weighted"], as_of=200.0)
        before = q.latest(conn, [1], ["token_weighted"], as_of=99.0)
    assert now.get(1, "token_weighted") == (200.0, 0.2)
    assert then.get(1, "token_weighted") == (100.0, 0.9)
    assert exact.get(1, "token_weighted") == (200.0, 0.2)  # at or before
    assert before.values == {}


def test_health_as_of_comes_from_the_up_samples(small: Engine) -> None:
    with small.connect() as conn:
        assert dbq.up_as_of(conn, 150.0) == [
            {"target_id": 1, "ts": 100.0, "up": True, "last_success_ts": 100.0}
        ]
        assert dbq.up_as_of(conn, 250.0) == [
            {"target_id": 1, "ts": 200.0, "up": False, "last_success_ts": 100.0}
        ]
        assert dbq.up_as_of(conn, 50.0) == []
        then = q.target_health(conn, as_of=150.0)[1]
        never = q.target_health(conn, as_of=50.0)[1]
    assert (then.up, then.last_scrape_ts, then.last_success_ts, then.last_error) == (True, 100.0, 100.0, None)
    assert (never.up, never.last_scrape_ts, never.last_success_ts) == (False, None, None)
    assert asof.last_scrape({1: then}) == 100.0


def test_regime_as_of_from_thin_reuse_samples(small: Engine) -> None:
    with small.connect() as conn:
        then = q.latest(conn, [1], ["thin_reuse"], as_of=150.0)
        later = q.latest(conn, [1], ["thin_reuse"], as_of=250.0)
    assert asof.sidecar_states_at(then, [1, None, 7]) == {1: {"ts": 100.0, "regime": "normal"}}
    assert asof.sidecar_states_at(later, [1]) == {1: {"ts": 200.0, "regime": "thin-reuse"}}


def test_firing_at_keeps_the_episodes_open_then() -> None:
    alerts = pd.DataFrame(
        {
            "rule": ["collapse", "down", "old", "later"],
            "state": ["firing", "resolved", "resolved", "firing"],
            "started_ts": [100.0, 100.0, 10.0, 300.0],
            "resolved_ts": [None, 250.0, 50.0, None],
        }
    )
    then = q.firing_at(alerts, 200.0)
    assert list(then["rule"]) == ["collapse", "down"]
    assert set(then["state"]) == {"firing"}


def _paused_at(fill_now: float) -> tuple[float, float]:
    """A paused time an hour before the fill's now (before engine a collapsed and c went down), and the
    time of the newest raw sample at or before it."""
    to = float(math.floor(fill_now - 3600))
    first = fill_now - 1.0 - RAW_SECONDS
    newest = first + RAW_STEP * math.floor((to - first) / RAW_STEP)
    assert fill_now - newest > COLLAPSE_AGO
    return to, newest


def _num(cell: object) -> float:
    """A table cell as a number, whether the table holds numbers or their text."""
    return float(str(cell).strip().rstrip("%"))


def test_paused_overview_shows_the_fleet_as_of_the_paused_time(db_url: str, fill_now: float) -> None:
    to, newest = _paused_at(fill_now)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update({"range": "1h", "to": f"{to:.0f}"})  # opened paused (a link), not paused later
    at.run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value.set_index("engine")
    # live: c DOWN, a COLLAPSED with 2 alerts and 12 parked; an hour earlier all three were healthy
    assert list(table["state"]) == ["healthy", "healthy", "healthy"]
    then = sidecar_signals("a", newest, fill_now)
    assert _num(table.loc["a", "R_t"]) == pytest.approx(then["token_weighted"], abs=0.005)
    assert _num(table.loc["a", "D"]) == pytest.approx(then["divergence"], abs=0.005)
    assert _num(table.loc["a", "open alerts"]) == 0
    assert _num(table.loc["a", "parked"]) == 0
    assert "(DOWN)" not in table.loc["c", "engine: last good scrape"]
    shown = texts(at)
    assert f"As of {asof.fmt_ts(to)} (paused)" in shown
    assert {m.label: m.value for m in at.metric}["healthy"] == "3"


def test_paused_compaction_shows_as_of_numbers_and_labels_the_latest_only_ones(
    db_url: str, fill_now: float
) -> None:
    to, newest = _paused_at(fill_now)
    at = app("compaction", engine="a", range="1h", to=f"{to:.0f}")
    then = sidecar_signals("a", newest, fill_now)
    metrics = {m.label.split(" (")[0]: m for m in at.metric}
    assert metrics["Regime"].value == "normal"  # live: thin-reuse
    assert metrics["D = R_r - R_t"].value == f"{then['divergence']:.2f}"
    assert metrics["R_t / R_r"].value == f"{then['token_weighted']:.2f} / {then['request_weighted']:.2f}"
    label = f"now, not as of {asof.fmt_ts(to)}"
    assert metrics["Operator deferral"].label == "Operator deferral (now)"
    assert label in metrics["Operator deferral"].proto.help
    shown = texts(at)
    assert f"Subtrees by warmth (hot first), {label}" in shown
    assert f"{label[0].upper()}{label[1:]}: Deferred by an operator" in shown
    assert "The database keeps only the sidecar's latest report" in shown


def test_live_compaction_still_shows_the_latest_state(db_url: str) -> None:
    at = app("compaction", engine="a")
    assert at.metric[0].value == "thin-reuse"
    assert at.metric[3].label == "Operator deferral"
    assert "not as of" not in texts(at)
