"""The reads the pages use (`dashboard.frames` over `db.queries`), with exact values over the filled fleet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine

from dashboard import frames as q
from db import make_engine
from tests.dashboard.fill import COLLAPSE_AGO, DOWN_AGO, NASTY_SESSION


@pytest.fixture
def engine(filled_template: tuple[Path, float], tmp_path: Path) -> Iterator[Engine]:
    import shutil

    dst = tmp_path / "frames.db"
    shutil.copyfile(filled_template[0], dst)
    eng = make_engine(f"sqlite:///{dst}")
    yield eng
    eng.dispose()


@pytest.fixture
def conn(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as c:
        yield c


def refs(conn: Connection) -> dict[str, q.EngineRef]:
    return {r.key: r for r in q.list_engines(conn)}


def test_engines_pair_each_engine_with_its_sidecar_in_natural_order(conn: Connection) -> None:
    engines = q.list_engines(conn)
    assert [e.key for e in engines] == ["a", "b", "c"]
    a = engines[0]
    assert a.engine_url == "http://127.0.0.1:18000" and a.sidecar_url == "http://127.0.0.1:18100"
    assert a.sidecar_name == "a-sidecar" and a.kind == "vllm" and len(a.target_ids) == 2


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["engine-10", "engine-2", "engine-1"], ["engine-1", "engine-2", "engine-10"]),
        (["b", "A", "a2", "a10"], ["A", "a2", "a10", "b"]),
    ],
)
def test_natural_key(names: list[str], expected: list[str]) -> None:
    assert sorted(names, key=q.natural_key) == expected


def test_target_health_and_heartbeat(conn: Connection, fill_now: float) -> None:
    c = refs(conn)["c"]
    health = q.target_health(conn)
    h = health[c.engine_target_id]
    assert (h.role, h.name, h.up, h.last_success_ts, h.consecutive_failures) == (
        "engine",
        "c",
        False,
        fill_now - DOWN_AGO,
        DOWN_AGO,
    )
    assert health[refs(conn)["a"].sidecar_target_id].up
    (beat,) = q.heartbeats(conn)
    assert (beat["name"], beat["targets"], beat["targets_up"]) == ("collectors", 6, 4)


def test_latest_keeps_ranks_apart_and_sums_them(conn: Connection, fill_now: float) -> None:
    b = refs(conn)["b"]
    latest = q.latest(conn, b.target_ids)
    assert latest.labels(b.engine_target_id) == ["0", "1"]
    assert latest.get(b.engine_target_id, "requests_running", "0")[0] == fill_now - 1.0
    assert latest.summed(b.engine_target_id, "requests_running") == 16.0
    assert latest.value(b.sidecar_target_id, "token_weighted") is not None
    assert q.latest(conn, []).values == {}


def test_series_frame_reads_raw_points_of_a_short_window(conn: Connection, fill_now: float) -> None:
    a = refs(conn)["a"]
    frame = q.series_frame(conn, (a.sidecar_target_id,), ("token_weighted",), fill_now - 60, fill_now)
    assert list(frame.columns) == ["ts", "target_id", "engine_label", "signal", "value"]
    assert set(frame["signal"]) == {"token_weighted"} and frame["ts"].max() == fill_now - 1.0
    assert len(frame) == 12  # one sample every 5 s
    assert q.series_frame(conn, (), ("token_weighted",), 0, 1).empty


def test_sessions_frame_carries_parked_since_and_leaves_gone_sessions_out(
    conn: Connection, fill_now: float
) -> None:
    a = refs(conn)["a"]
    frame = q.sessions_frame(conn, (a.sidecar_target_id,))
    assert len(frame) == 30 and NASTY_SESSION in set(frame["session_id"])
    assert (frame["state"] == "parked").sum() == 6
    first = frame[frame["session_id"] == "agent-000"].iloc[0]
    assert first["parked_since"] == fill_now - 600 and bool(first["manual"])
    assert q.sessions_frame(conn, ()).empty


def test_subtrees_decisions_audit_and_events(conn: Connection, fill_now: float) -> None:
    a = refs(conn)["a"]
    subtrees = q.subtrees_frame(conn, (a.sidecar_target_id,))
    assert list(subtrees["subtree_id"]) == [
        "system-prompt-0",
        "system-prompt-1",
        "system-prompt-3",
        "system-prompt-2",
    ]  # most recently hit first
    decisions = q.decisions_frame(
        conn, (a.sidecar_target_id,), fill_now - COLLAPSE_AGO, fill_now - COLLAPSE_AGO + 240
    )
    assert list(decisions["ts"]) == [
        fill_now - COLLAPSE_AGO + 240,
        fill_now - COLLAPSE_AGO + 120,
        fill_now - COLLAPSE_AGO,
    ]
    audit = q.audit_frame(conn, fill_now - 3600, fill_now)
    assert list(audit["action"]) == ["compaction.defer", "park", "sign-in"]
    assert audit.iloc[0]["target"] == "a-sidecar" and audit.iloc[0]["after"] == {
        "deferred_until": fill_now + 900
    }
    events = q.events_frame(conn, a, fill_now - 3600, fill_now)
    assert list(events["kind"].value_counts().sort_index().items()) == [
        ("action", 2),
        ("alert", 2),
        ("compaction", 12),
    ]


def test_alerts_and_silences(conn: Connection, engine: Engine, fill_now: float) -> None:
    alerts = q.alerts_frame(conn, since=fill_now - 3600)
    assert sorted(alerts["rule"]) == ["collapse", "target-down", "thin-reuse"]  # the resolved one is older
    assert set(q.alerts_frame(conn, since=fill_now - 6 * 3600)["rule"]) >= {"demand-over-band"}
    # until: an "at that moment" view leaves out alerts that started after it
    at = fill_now - COLLAPSE_AGO + 90
    assert set(q.alerts_frame(conn, since=at - 3600, until=at)["rule"]) == {"thin-reuse"}
    silences = q.silences_frame(conn, fill_now)
    assert list(silences["rule"]) == ["demand-over-band"] and silences.iloc[0]["target"] == "b-sidecar"
    sid = int(silences.iloc[0]["id"])
    assert q.expire_silence(engine, sid, now=fill_now)
    assert not q.expire_silence(engine, sid, now=fill_now + 1)
    assert q.silences_frame(conn, fill_now).empty


@pytest.mark.parametrize(
    ("params", "shared", "expected"),
    [
        ({}, {}, (1000.0 - 3600, 1000.0, "1h", None, True)),
        ({}, {"range": "6h"}, (1000.0 - 6 * 3600, 1000.0, "6h", None, True)),  # the last page's choice
        ({"range": "15m", "to": "900"}, {}, (0.0, 900.0, "15m", None, False)),  # paused
        ({"range": "custom", "from": "100", "to": "200"}, {}, (100.0, 200.0, "custom", None, False)),
        ({"range": "15m", "at": "500"}, {}, (50.0, 950.0, "15m", 500.0, False)),  # centred on the moment
        ({"range": "bogus"}, {}, (1000.0 - 3600, 1000.0, "1h", None, True)),
    ],
)
def test_time_window_from_the_url_and_the_session(params: dict, shared: dict, expected: tuple) -> None:
    from dashboard.timerange import resolve

    w = resolve(params, shared, 1000.0)
    assert (w.start, w.end, w.label, w.at, w.live) == expected
