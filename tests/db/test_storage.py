"""Storage on SQLite and PostgreSQL: migrations, batched writes, rollups, retention and the page queries."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import func, inspect, select, text

from collectors.config import CollectorConfig, EngineTarget, SidecarTarget
from collectors.rollups import rollup_rows
from collectors.scrape import ScrapeOutcome
from collectors.store import Store
from core import signals as sig
from db import make_engine, queries
from db.migrate import current_revision, head_revision, upgrade
from db.models import (
    AuditEntry,
    Base,
    CompactionDecision,
    Rollup1m,
    Rollup10m,
    Sample,
    Series,
    Session,
    Target,
)

ENGINE_URL = "http://engine:8000"
SIDECAR_URL = "http://sidecar:8100"
T0 = 1_800_000_000.0  # a minute boundary


def config() -> CollectorConfig:
    return CollectorConfig(
        engines=(EngineTarget(ENGINE_URL, name="e0", labels={"cluster": "eu"}),),
        sidecars=(SidecarTarget(SIDECAR_URL, engine=ENGINE_URL),),
    )


@pytest.fixture
def store(db_url):
    engine = make_engine(db_url)
    upgrade(engine)
    s = Store(engine, clock=lambda: T0)
    s.sync_targets(config())
    yield s
    engine.dispose()


def engine_outcome(ts: float, value: float, ok: bool = True) -> ScrapeOutcome:
    return ScrapeOutcome(
        ENGINE_URL,
        "engine",
        ts,
        ok,
        0.01,
        error=None if ok else "connection refused",
        kind="vllm",
        samples=[("0", sig.KV_USAGE, value), ("0", sig.REQUESTS_RUNNING, 3.0), ("", sig.UP, 1.0)],
        engine_labels=("0",),
    )


def test_migrations_create_the_models_schema(db_url):
    engine = make_engine(db_url)
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    upgrade(engine)  # idempotent
    assert current_revision(engine) == head_revision()


def test_upgrade_of_a_database_made_without_migrations_keeps_its_history(db_url):
    engine = make_engine(db_url)
    Base.metadata.create_all(engine)  # an early database: tables, no alembic_version
    with engine.begin() as conn:
        conn.execute(
            Target.__table__.insert().values(
                url="http://old:1",
                role="engine",
                kind="vllm",
                configured_kind="auto",
                labels={},
                configured=True,
                interval_s=1.0,
                up=True,
                consecutive_failures=0,
                created_ts=1.0,
            )
        )
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        assert conn.execute(select(Target.url)).scalars().all() == ["http://old:1"]


def test_upgrade_from_the_first_revision_keeps_samples_and_backfills_10m_rollups(db_url):
    engine = make_engine(db_url)
    upgrade(engine, "0001")
    assert "rollups_10m" not in inspect(engine).get_table_names()
    old = Store(engine, clock=lambda: T0)
    old.sync_targets(config())
    old.write([engine_outcome(T0 + i, 1.0) for i in range(1200)])
    with engine.begin() as conn:  # what a 0001-era collector had rolled up (no 10-minute tier)
        from db.models import CollectorState

        conn.execute(CollectorState.__table__.insert().values(key=queries.ROLLUP_WATERMARK_KEY, value=T0))
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    new = Store(engine, clock=lambda: T0)
    new.sync_targets(config())
    new.rollup(now=T0 + 1200 + 20)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Sample)).scalar() == 1200 * 3
        assert conn.execute(select(func.count()).select_from(Rollup10m)).scalar() == 2 * 3


def test_sqlite_pragmas_and_without_rowid(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    engine = make_engine(url)
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 1000
        ddl = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = 'samples'")).scalar()
    assert "WITHOUT ROWID" in ddl
    reader = make_engine(url, read_only=True)
    with reader.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Target)).scalar() == 0
        with pytest.raises(Exception, match="readonly"):
            conn.execute(text("INSERT INTO collector_state(key, value) VALUES ('x', 1)"))


def test_batched_write_and_latest_signals(store):
    store.write([engine_outcome(T0 + i, 0.1 * i) for i in range(1, 4)])
    store.write([ScrapeOutcome(SIDECAR_URL, "sidecar", T0 + 3, False, 2.0, error="timeout after 2 s")])
    with store.engine.connect() as conn:
        latest = queries.latest_signals(conn)
        targets = {t["url"]: t for t in queries.targets(conn)}
    by_key = {(r["url"], r["engine"]): r for r in latest}
    assert by_key[(ENGINE_URL, "0")][sig.KV_USAGE] == pytest.approx(0.3)
    assert by_key[(ENGINE_URL, "0")]["kind"] == "vllm"
    assert by_key[(SIDECAR_URL, None)][sig.UP] == 0.0
    assert targets[SIDECAR_URL]["last_error"] == "timeout after 2 s"
    assert targets[SIDECAR_URL]["consecutive_failures"] == 1
    assert targets[ENGINE_URL]["up"] and targets[ENGINE_URL]["last_success_ts"] == T0 + 3
    assert targets[ENGINE_URL]["labels"] == {"cluster": "eu"}


def test_failed_scrape_keeps_last_good_values(store):
    store.write([engine_outcome(T0 + 1, 0.7)])
    store.write([engine_outcome(T0 + 2, 0.0, ok=False)])
    with store.engine.connect() as conn:
        assert queries.latest_value(conn, store.target_ids[ENGINE_URL], sig.KV_USAGE, "0") == (T0 + 1, 0.7)
        assert queries.latest_value(conn, store.target_ids[ENGINE_URL], sig.UP) == (T0 + 2, 0.0)


def test_rollups_and_resolution_choice(store):
    # 10 minutes of 1 s samples: value = second within the minute.
    store.write([engine_outcome(T0 + i, float(i % 60)) for i in range(600)])
    written = store.rollup(now=T0 + 600 + 20)
    assert written == 10 * 3 + 1 * 3  # 3 series x 10 minutes, and their first 10-minute rollup
    with store.engine.connect() as conn:
        kv_series = conn.execute(select(Series.id).where(Series.signal == sig.KV_USAGE)).scalar()
        rows = conn.execute(
            select(Rollup1m.ts, Rollup1m.min, Rollup1m.max, Rollup1m.last, Rollup1m.count, Rollup1m.mean)
            .where(Rollup1m.series_id == kv_series)
            .order_by(Rollup1m.ts)
        ).all()
        assert len(rows) == 10
        first = rows[0]
        assert (first.ts, first.min, first.max, first.last, first.count) == (T0, 0.0, 59.0, 59.0, 60)
        assert first.mean == pytest.approx(29.5)
        assert queries.rollup_watermark(conn) == T0 + 600
        # Incremental: a second call has nothing new to do.
    assert store.rollup(now=T0 + 600 + 20) == 0
    with store.engine.connect() as conn:
        raw = queries.series_range(conn, signals=sig.KV_USAGE, start_ts=T0, end_ts=T0 + 599)
        assert raw["resolution"] == "raw" and len(raw["series"][0]["ts"]) == 600
        few = queries.series_range(conn, signals=[sig.KV_USAGE], start_ts=T0, end_ts=T0 + 599, max_points=100)
        assert few["resolution"] == "raw" and few["bucket_s"] == 6 and len(few["series"][0]["ts"]) <= 100
        minute = queries.series_range(
            conn, signals=[sig.KV_USAGE], start_ts=T0, end_ts=T0 + 599, max_points=5
        )
        assert minute["resolution"] == "1m" and minute["bucket_s"] == 120.0
        s = minute["series"][0]
        assert len(s["ts"]) == 5 and s["value"][0] == pytest.approx(29.5) and s["max"][0] == 59.0
        assert s["engine"] == "0" and s["signal"] == sig.KV_USAGE


def test_long_range_uses_rollups_plus_raw_tail(store):
    store.write([engine_outcome(T0 + i, 1.0) for i in range(0, 300)])
    store.rollup(now=T0 + 180 + 20)  # minutes 0..2 rolled up, 3..4 only raw
    with store.engine.connect() as conn:
        result = queries.series_range(conn, signals=[sig.KV_USAGE], start_ts=T0 - 86400, end_ts=T0 + 299)
    assert result["resolution"] == "1m"
    ts = result["series"][0]["ts"]
    assert ts == sorted(ts) and len(ts) == len(set(ts))
    assert ts[-1] >= T0 + 180  # the tail after the watermark comes from raw samples


@pytest.mark.parametrize(
    ("span_s", "expected"),
    [
        (600, ("raw", 0.0)),
        (3600, ("raw", 2.0)),
        (86400, ("1m", 60.0)),
        (2 * 86400, ("1m", 120.0)),
        (7 * 86400, ("10m", 600.0)),
        (30 * 86400, ("10m", 1800.0)),
    ],
)
def test_no_chart_exceeds_max_points(span_s, expected):
    resolution, bucket = queries.choose_resolution(0, span_s)
    assert (resolution, bucket) == expected
    assert span_s / (bucket or 1.0) <= queries.DEFAULT_MAX_POINTS


def test_ten_minute_rollups_and_week_view(store):
    # 30 minutes of samples; the value is the minute number.
    store.write([engine_outcome(T0 + i, float(i // 60)) for i in range(1800)])
    store.rollup(now=T0 + 1800 + 20)
    with store.engine.connect() as conn:
        kv_series = conn.execute(select(Series.id).where(Series.signal == sig.KV_USAGE)).scalar()
        rows = conn.execute(
            select(
                Rollup10m.ts, Rollup10m.min, Rollup10m.max, Rollup10m.mean, Rollup10m.last, Rollup10m.count
            )
            .where(Rollup10m.series_id == kv_series)
            .order_by(Rollup10m.ts)
        ).all()
        assert [tuple(r) for r in rows] == [
            (T0, 0.0, 9.0, 4.5, 9.0, 600),
            (T0 + 600, 10.0, 19.0, 14.5, 19.0, 600),
            (T0 + 1200, 20.0, 29.0, 24.5, 29.0, 600),
        ]
        assert queries.rollup_watermark(conn, queries.ROLLUP10_WATERMARK_KEY) == T0 + 1800
        week = queries.series_range(
            conn, signals=[sig.KV_USAGE], start_ts=T0 + 1800 - 7 * 86400, end_ts=T0 + 1800
        )
        assert week["resolution"] == "10m" and week["series"][0]["value"] == [4.5, 14.5, 24.5]
        # Forcing a finer tier still works (what a zoomed chart asks for).
        minute = queries.series_range(
            conn, signals=[sig.KV_USAGE], start_ts=T0, end_ts=T0 + 1799, resolution="1m"
        )
        assert minute["resolution"] == "1m" and len(minute["series"][0]["ts"]) == 30


def test_retention_drops_old_raw_only_after_rollup(store):
    store.write([engine_outcome(T0 + i, 1.0) for i in range(0, 180)])
    raw, _ = store.retention(raw_retention_s=60, rollup_retention_s=86400, now=T0 + 400)
    assert raw == 0  # nothing rolled up yet: raw samples are not dropped
    store.rollup(now=T0 + 400)
    raw, _ = store.retention(raw_retention_s=60, rollup_retention_s=86400, now=T0 + 400)
    assert raw == 180 * 3
    _, rolled = store.retention(raw_retention_s=60, rollup_retention_s=100, now=T0 + 400)
    assert rolled == 3 * 3
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Sample)).scalar() == 0


def sidecar_outcome(ts: float, sessions, decisions=(), audit=()) -> ScrapeOutcome:
    return ScrapeOutcome(
        SIDECAR_URL,
        "sidecar",
        ts,
        True,
        0.01,
        kind="sidecar",
        samples=[("", sig.TOKEN_WEIGHTED, 0.5)],
        state={"reuse": {"regime": "normal"}, "warnings": []},
        sessions=list(sessions),
        subtrees=[],
        decisions=list(decisions),
        audit=list(audit),
    )


def session(sid: str, state: str = "admitted", ctx: int = 100) -> dict:
    return {
        "session_id": sid,
        "state": state,
        "context_tokens": ctx,
        "turns": 1,
        "manual": False,
        "pinned": None,
        "last_cached_fraction": 0.5,
        "present": state != "ended",
        "data": {"id": sid},
    }


def test_sessions_upsert_and_incremental_entries_without_duplicates(store):
    d1 = {
        "remote_id": 1,
        "ts": T0,
        "subtree_id": "a",
        "decision": "granted",
        "granted": True,
        "reason": "cold",
        "divergence": None,
        "data": {},
    }
    a1 = {
        "remote_id": 1,
        "ts": T0,
        "actor": "op",
        "action": "park",
        "params": {},
        "outcome": "ok",
        "data": {},
    }
    store.write([sidecar_outcome(T0, [session("s1"), session("s2")], [d1], [a1])])
    # The same entries again (a restarted collector re-reading) plus a new one: no duplicates.
    a2 = dict(a1, remote_id=2, action="unpark")
    store.write([sidecar_outcome(T0 + 1, [session("s1", "parked", 500)], [d1], [a1, a2])])
    with store.engine.connect() as conn:
        rows = {s["session_id"]: s for s in queries.sessions(conn, present_only=False)}
        assert (
            rows["s1"]["state"] == "parked" and rows["s1"]["context_tokens"] == 500 and rows["s1"]["present"]
        )
        assert not rows["s2"]["present"]
        assert [s["session_id"] for s in queries.sessions(conn)] == ["s1"]
        assert conn.execute(select(func.count()).select_from(CompactionDecision)).scalar() == 1
        assert [a["action"] for a in queries.audit(conn)] == ["unpark", "park"]
        assert conn.execute(select(func.count()).select_from(AuditEntry)).scalar() == 2
        assert queries.sidecar_state(conn)[0]["regime"] == "normal"
    cursors = store.cursors(SIDECAR_URL)
    assert (cursors["decisions"].after_id, cursors["audit"].after_id) == (1, 2)
    assert (cursors["audit"].epoch, cursors["audit"].key, cursors["audit"].ts) == (0, "unpark", T0)


def test_a_session_deleted_by_retention_can_come_back(store):
    store.write([sidecar_outcome(T0, [session("s1", "ended")])])
    store.retention(3600.0, 86400.0, now=T0 + 10 * 86400.0)  # ended long ago: the row is deleted
    with store.engine.connect() as conn:
        assert queries.sessions(conn, present_only=False) == []
    store.write(
        [sidecar_outcome(T0 + 10 * 86400.0, [session("s1", "admitted", 700)])]
    )  # the id is used again
    with store.engine.connect() as conn:
        assert [(s["session_id"], s["context_tokens"]) for s in queries.sessions(conn)] == [("s1", 700)]


def test_dashboard_writes(store):
    with store.engine.connect() as conn:
        queries.record_dashboard_action(
            conn,
            actor="alice",
            action="park",
            target_url=SIDECAR_URL,
            params={"session": "s1"},
            outcome="ok",
            ts=T0,
        )
        conn.commit()
        queries.add_silence(conn, rule="collapse", target_id=None, duration_s=600, by="alice", now=T0)
        conn.commit()
        entries = queries.audit(conn, source="dashboard")
        assert entries[0]["actor"] == "alice" and entries[0]["target_url"] == SIDECAR_URL
        assert len(queries.silences(conn, active_at=T0 + 10)) == 1
        assert queries.silences(conn, active_at=T0 + 601) == []
    with pytest.raises(ValueError, match="positive"):
        queries.add_silence(store.engine, rule=None, target_id=None, duration_s=0, by=None)


def test_target_removed_from_config_is_kept_but_unconfigured(store):
    store.write([engine_outcome(T0 + 1, 0.5)])
    store.sync_targets(CollectorConfig(sidecars=(SidecarTarget(SIDECAR_URL),)))
    with store.engine.connect() as conn:
        targets = {t["url"]: t for t in queries.targets(conn)}
        assert not targets[ENGINE_URL]["configured"]
        assert [t["url"] for t in queries.targets(conn, configured_only=True)] == [SIDECAR_URL]
        assert conn.execute(select(func.count()).select_from(Sample)).scalar() > 0


def test_rollup_rows_pure():
    rows = [(1, 0.0, 1.0), (1, 30.0, 3.0), (1, 60.0, 5.0), (2, 0.0, math.pi)]
    out = rollup_rows(rows)
    assert [(r["series_id"], r["ts"], r["min"], r["max"], r["mean"], r["last"], r["count"]) for r in out] == [
        (1, 0.0, 1.0, 3.0, 2.0, 3.0, 2),
        (1, 60.0, 5.0, 5.0, 5.0, 5.0, 1),
        (2, 0.0, math.pi, math.pi, math.pi, math.pi, 1),
    ]


def test_schema_has_the_tables_pages_read(db_url):
    engine = make_engine(db_url)
    upgrade(engine)
    names = set(inspect(engine).get_table_names())
    assert {
        "targets",
        "series",
        "samples",
        "rollups_1m",
        "sidecar_state",
        "sessions",
        "subtrees",
        "rollups_10m",
        "compaction_decisions",
        "audit",
        "alerts",
        "silences",
        "notifications",
        "collector_heartbeat",
        "collector_state",
    } <= names
    assert Session.__tablename__ in names


def test_target_totals_sum_engine_labels():
    rows = [
        {
            "target_id": 1,
            "url": "u",
            "name": None,
            "role": "engine",
            "kind": "vllm",
            "up": True,
            "engine": "0",
            "ts": 5.0,
            sig.PREFIX_CACHE_HITS_PER_S: 80.0,
            sig.PREFIX_CACHE_QUERIES_PER_S: 100.0,
            sig.ENGINE_HIT_RATIO: 0.8,
            sig.KV_USAGE: 0.2,
            sig.POOL_TOKENS: 1000.0,
            sig.REQUESTS_RUNNING: 2.0,
        },
        {
            "target_id": 1,
            "url": "u",
            "name": None,
            "role": "engine",
            "kind": "vllm",
            "up": True,
            "engine": "1",
            "ts": 6.0,
            sig.PREFIX_CACHE_HITS_PER_S: 0.0,
            sig.PREFIX_CACHE_QUERIES_PER_S: 300.0,
            sig.ENGINE_HIT_RATIO: 0.0,
            sig.KV_USAGE: 0.6,
            sig.POOL_TOKENS: 3000.0,
            sig.REQUESTS_RUNNING: 5.0,
        },
        {
            "target_id": 1,
            "url": "u",
            "name": None,
            "role": "engine",
            "kind": "vllm",
            "up": True,
            "engine": None,
            "ts": 6.0,
            sig.UP: 1.0,
        },
        {
            "target_id": 2,
            "url": "s",
            "name": None,
            "role": "sidecar",
            "kind": "sidecar",
            "up": True,
            "engine": None,
            "ts": 6.0,
            sig.TOKEN_WEIGHTED: 0.5,
        },
    ]
    totals = {r["url"]: r for r in queries.target_totals(rows)}
    e = totals["u"]
    assert e["engine"] is None and e["engines"] == ["0", "1"] and e[sig.UP] == 1.0
    assert e[sig.ENGINE_HIT_RATIO] == pytest.approx(80 / 400)  # not the mean of 0.8 and 0.0
    assert e[sig.REQUESTS_RUNNING] == 7.0 and e[sig.POOL_TOKENS] == 4000.0
    assert e[sig.KV_USAGE] == pytest.approx((0.2 * 1000 + 0.6 * 3000) / 4000)
    assert totals["s"][sig.TOKEN_WEIGHTED] == 0.5


def test_upgrade_to_log_epochs_keeps_audit_and_decisions(db_url):
    engine = make_engine(db_url)
    upgrade(engine, "0002")
    with engine.begin() as conn:  # what a 0002-era collector had stored
        conn.execute(
            text(
                "INSERT INTO targets (url, role, kind, configured_kind, labels, configured, interval_s, up, "
                "consecutive_failures, created_ts) VALUES ('http://s:1', 'sidecar', 'sidecar', 'sidecar', "
                "'{}', true, 1.0, true, 0, 1.0)"
            )
        )
        tid = conn.execute(text("SELECT id FROM targets")).scalar()
        conn.execute(
            text(
                "INSERT INTO audit (source, target_id, remote_id, ts, actor, action, data) "
                "VALUES ('sidecar', :t, 7, 5.0, 'op', 'park', '{}')"
            ),
            {"t": tid},
        )
        conn.execute(
            text(
                "INSERT INTO compaction_decisions (target_id, remote_id, ts, decision, data) "
                "VALUES (:t, 3, 5.0, 'granted', '{}')"
            ),
            {"t": tid},
        )
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    with engine.begin() as conn:
        assert conn.execute(select(AuditEntry.epoch, AuditEntry.remote_id, AuditEntry.action)).all() == [
            (0, 7, "park")
        ]
        assert conn.execute(select(CompactionDecision.epoch, CompactionDecision.remote_id)).all() == [(0, 3)]
        # The same remote id in the next epoch (a wiped sidecar) is a new entry; in the same epoch it is not.
        conn.execute(
            AuditEntry.__table__.insert().values(
                source="sidecar", target_id=tid, epoch=1, remote_id=7, ts=6.0, data={}
            )
        )
    with pytest.raises(Exception, match="(?i)unique"), engine.begin() as conn:
        conn.execute(
            AuditEntry.__table__.insert().values(
                source="sidecar", target_id=tid, epoch=1, remote_id=7, ts=7.0, data={}
            )
        )
    engine.dispose()


def test_upgrade_to_turns_keeps_data_and_turns_are_stored_once_and_pruned_with_raw(db_url):
    from db.models import Turn

    engine = make_engine(db_url)
    upgrade(engine, "0004")
    with engine.begin() as conn:  # what a 0004-era collector had stored
        conn.execute(
            text(
                "INSERT INTO targets (url, role, kind, configured_kind, labels, configured, interval_s, up, "
                "consecutive_failures, created_ts) VALUES ('http://sidecar:8100', 'sidecar', 'sidecar', "
                "'sidecar', '{}', true, 1.0, true, 0, 1.0)"
            )
        )
        tid = conn.execute(text("SELECT id FROM targets")).scalar()
        conn.execute(
            text(
                "INSERT INTO audit (source, target_id, epoch, remote_id, ts, actor, action, data) "
                "VALUES ('sidecar', :t, 0, 7, 5.0, 'op', 'park', '{}')"
            ),
            {"t": tid},
        )
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    assert {ix["name"] for ix in inspect(engine).get_indexes("turns")} >= {
        "ix_turns_ts",
        "ix_turns_session_id",
    }
    s = Store(engine, clock=lambda: T0)
    s.sync_targets(config())
    with engine.begin() as conn:
        assert conn.execute(select(AuditEntry.remote_id, AuditEntry.action)).all() == [(7, "park")]
    t1 = {
        "remote_id": 1,
        "ts": T0 - 90_000,
        "session_id": "s1",
        "subtree_id": None,
        "prompt_tokens": 100,
        "cached_tokens": 0,
        "completion_tokens": 5,
        "held_s": 0.0,
        "parked_s": 0.0,
        "latency_s": 0.1,
        "outcome": "ok",
        "model": "m",
    }
    t2 = dict(t1, remote_id=2, ts=T0 - 10)
    o = sidecar_outcome(T0, [session("s1")])
    s.write([ScrapeOutcome(**{**o.__dict__, "turns": [t1]})])
    s.write(
        [ScrapeOutcome(**{**o.__dict__, "ts": T0 + 1, "turns": [t1, t2]})]
    )  # re-read after a restart: stored once
    with engine.begin() as conn:
        assert conn.execute(select(Turn.remote_id).order_by(Turn.remote_id)).scalars().all() == [1, 2]
    assert s.cursors(SIDECAR_URL)["turns"].after_id == 2 and s.cursors(SIDECAR_URL)["turns"].key == "ok"
    with engine.begin() as conn:  # pretend everything is rolled up, so the raw tier can be pruned
        from db.queries import ROLLUP_WATERMARK_KEY

        s._set_state(conn, ROLLUP_WATERMARK_KEY, T0)
    s.retention(24 * 3600.0, 30 * 86400.0, now=T0)
    with engine.begin() as conn:
        assert conn.execute(select(Turn.remote_id)).scalars().all() == [2]
    engine.dispose()
