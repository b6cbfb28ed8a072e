"""Faults on the write path (issue 11 items 1, 2 and 4): nothing lost, nothing cross-wired.

Real HTTP targets on loopback, the collector in-process with a stepped clock, and faults on
the database itself: a lock held longer than a write's timeout (SQLite and PostgreSQL), a
full disk (a small tmpfs when root, SQLite's max_page_count otherwise), a sidecar whose state
db is wiped, a target whose write always fails, and values far out of range.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import event, func, select, text

from collectors.config import CollectorConfig, EngineTarget, SidecarTarget
from collectors.service import Collector
from core import signals as sig
from core.alerts import AlertSettings
from db import make_engine
from db.migrate import upgrade
from db.models import AuditEntry, CompactionDecision, Sample, Series, Session, Target
from tests.collectors.fake_targets import FakeEngine, FakeSidecar
from tests.support import FakeClock

LOCK_TIMEOUT_MS = 300


class Rig:
    """A collector over one engine and one sidecar; `restart()` is a new collector process."""

    def __init__(
        self,
        db_url: str,
        engine: FakeEngine,
        sidecar: FakeSidecar,
        *,
        timeout_s: float = 2.0,
        **engine_kwargs: object,
    ) -> None:
        self.clock = FakeClock()
        self.db = make_engine(db_url, **engine_kwargs)  # type: ignore[arg-type]
        upgrade(self.db)
        settings = AlertSettings(down_after_failures=2, down_for_s=0, up_for_s=0, stale_after_s=30)
        self.config = CollectorConfig(
            engines=(EngineTarget(engine.url, name="fake"),),
            sidecars=(SidecarTarget(sidecar.url, engine=engine.url),),
            timeout_s=timeout_s,
            alerts=settings,
        )
        self.engine, self.sidecar = engine, sidecar
        self.collector = Collector(self.config, self.db, clock=self.clock)

    def restart(self) -> None:
        self.collector.client.close()
        self.collector = Collector(self.config, self.db, clock=self.clock)

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.clock.t += 1.0
            for url in list(self.collector.scrapers):
                self.collector.scrape_target(url)
            batch = []
            while not self.collector.queue.empty():
                batch.append(self.collector.queue.get_nowait())
            self.collector.process(batch)

    def tid(self, url: str) -> int:
        return self.collector.store.target_ids[url]

    def audit_ids(self) -> list[tuple[int, int, str | None]]:
        with self.db.connect() as conn:
            return [
                (r.epoch, r.remote_id, r.action)
                for r in conn.execute(
                    select(AuditEntry.epoch, AuditEntry.remote_id, AuditEntry.action)
                    .where(AuditEntry.source == "sidecar")
                    .order_by(AuditEntry.epoch, AuditEntry.remote_id)
                )
            ]

    def close(self) -> None:
        self.collector.client.close()
        self.db.dispose()


@contextlib.contextmanager
def database_lock(db_url: str) -> Iterator[None]:
    """Another process holds the write lock (SQLite) / an exclusive table lock (PostgreSQL)."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    holder = make_engine(db_url)
    with holder.connect() as conn:
        trans = conn.begin()
        conn.execute(text("LOCK TABLE targets, audit, compaction_decisions IN ACCESS EXCLUSIVE MODE"))
        try:
            yield
        finally:
            trans.rollback()
    holder.dispose()


def write_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_locked_database_loses_no_audit_entry_and_logs_one_line(db_url, caplog):
    caplog.set_level(logging.WARNING)
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        rig = Rig(db_url, engine, sidecar, lock_timeout_ms=LOCK_TIMEOUT_MS)
        try:
            sidecar.add_audit("budgeter.update")
            rig.tick(2)
            # Operator actions while the database is locked for longer than a write may wait.
            with database_lock(db_url):
                for i in range(6):
                    sidecar.add_audit(f"park-{i}")
                    sidecar.add_decision("granted")
                    rig.tick()
            errors = write_errors(caplog)
            assert rig.collector.write_failures == 6
            assert len(errors) == 1, errors  # one line for the same cause, not one per second
            assert "\n" not in errors[0] and "[SQL" not in errors[0] and "parameters" not in errors[0]
            assert "lock" in errors[0].lower(), errors[0]
            rig.tick(2)
            assert [i for _, i, _ in rig.audit_ids()] == list(range(1, 8))
            # Locked again, then the collector dies before it could store anything: its successor
            # re-reads from the last stored id.
            with database_lock(db_url):
                for i in range(3):
                    sidecar.add_audit(f"unpark-{i}")
                    rig.tick()
            rig.restart()
            rig.tick(2)
            ids = [i for _, i, _ in rig.audit_ids()]
            assert ids == list(range(1, 11)), ids  # every id once: none lost, none twice
            with rig.db.connect() as conn:
                assert conn.execute(select(func.count()).select_from(CompactionDecision)).scalar() == 6
                # The engine's samples of the locked seconds were kept and written once the lock went.
                kv = conn.execute(
                    select(func.count())
                    .select_from(Sample)
                    .join(Series, Series.id == Sample.series_id)
                    .where(Series.signal == sig.KV_USAGE)
                ).scalar()
            assert kv == 2 + 6 + 2 + 2  # the dead collector's 3 retries died with it
        finally:
            rig.close()


def test_wiped_sidecar_log_is_read_again_in_a_new_epoch(tmp_path):
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        rig = Rig(f"sqlite:///{tmp_path / 'p.db'}", engine, sidecar)
        try:
            for action in ("a1", "a2", "a3"):
                sidecar.add_audit(action)
            rig.tick(2)
            sidecar.wipe()
            for i in range(5):  # the new log grows past the old cursor before anyone looks
                sidecar.add_audit(f"new-{i}")
            rig.tick(2)
            assert rig.audit_ids() == [(0, 1, "a1"), (0, 2, "a2"), (0, 3, "a3")] + [
                (1, i + 1, f"new-{i}") for i in range(5)
            ]
            with rig.db.connect() as conn:  # and the audit says so, once per log
                notes = conn.execute(
                    select(AuditEntry.action, AuditEntry.params).where(AuditEntry.source == "collector")
                ).all()
            assert [tuple(n) for n in notes] == [("sidecar-log-restarted", {"log": "audit", "epoch": 1})]
            rig.restart()  # resumes in the new epoch: nothing twice
            sidecar.add_audit("later")
            rig.tick(2)
            assert rig.audit_ids()[-2:] == [(1, 5, "new-4"), (1, 6, "later")] and len(rig.audit_ids()) == 9
        finally:
            rig.close()


@contextlib.contextmanager
def small_disk(kind: str, directory: Path) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """(database URL, fill(), free()): a database whose disk can be filled and freed again."""
    if kind == "tmpfs":
        if os.geteuid() != 0:
            pytest.skip("a tmpfs needs root; the max_page_count variant covers the same fault")
        mount = directory / "disk"
        mount.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True, text=True
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); max_page_count covers it")
        filler = mount / "filler"

        def fill() -> None:
            stat = os.statvfs(mount)
            free = stat.f_bavail * stat.f_frsize
            with open(filler, "wb") as f:
                f.write(b"\0" * max(0, free - 256 * 1024))

        try:
            yield f"sqlite:///{mount / 'p.db'}", fill, lambda: filler.unlink()
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False)
        return
    limit = {"pages": 2**31 - 2}
    url = f"sqlite:///{directory / 'p.db'}"
    engines: list[object] = []

    def fill() -> None:
        with sqlite3.connect(directory / "p.db") as conn:
            limit["pages"] = conn.execute("PRAGMA page_count").fetchone()[0] + 20
        for e in engines:
            e.dispose()  # type: ignore[attr-defined]

    def free() -> None:
        limit["pages"] = 2**31 - 2
        for e in engines:
            e.dispose()  # type: ignore[attr-defined]

    original = make_engine

    def limited(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        e = original(*args, **kwargs)  # type: ignore[arg-type]

        @event.listens_for(e, "connect")
        def _pages(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            dbapi_connection.execute(f"PRAGMA max_page_count={limit['pages']}")

        engines.append(e)
        return e

    import tests.collectors.test_write_faults as me

    me.make_engine = limited  # type: ignore[assignment]
    try:
        yield url, fill, free
    finally:
        me.make_engine = original  # type: ignore[assignment]


@pytest.mark.parametrize("kind", ["tmpfs", "max_page_count"])
def test_full_disk_with_10000_sessions_orphans_and_crosswires_nothing(kind, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    with small_disk(kind, tmp_path) as (url, fill, free), FakeEngine() as engine, FakeSidecar() as sidecar:
        # Serving 10,000 sessions from the fake sidecar took over 2 s once on a loaded CI machine; this
        # test is about the write path, not scrape timeouts, so it gives the scrape room.
        rig = Rig(url, engine, sidecar, timeout_s=30.0)
        try:
            rig.tick(2)
            sidecar.set_sessions(10_000)
            sidecar.state_overrides["backlog.oldest_waiting_s"] = (
                12.5  # a new series, made in a failing write
            )
            fill()
            rig.tick(3)
            assert rig.collector.write_failures >= 1
            free()
            engine.engines = ("0", "1")  # new series after the rollback: they must not get the lost ids
            rig.tick(2)
            rig.restart()
            rig.tick(2)
            with rig.db.connect() as conn:
                assert conn.execute(text("PRAGMA integrity_check")).scalar() == "ok"
                orphans = conn.execute(
                    text("SELECT count(*) FROM samples WHERE series_id NOT IN (SELECT id FROM series)")
                ).scalar()
                assert orphans == 0
                engine_id, sidecar_id = rig.tid(engine.url), rig.tid(sidecar.url)
                # No relabelled history: every series holds only the values its own signal reports.
                expected = {
                    (engine_id, sig.KV_USAGE): {0.42},
                    (engine_id, sig.REQUESTS_RUNNING): {3.0},
                    (engine_id, sig.REQUESTS_WAITING): {1.0},
                    (sidecar_id, sig.POOL_TOKENS): {400000.0},
                    (sidecar_id, sig.DEMAND_TOKENS): {200000.0},
                    (sidecar_id, sig.ADMITTED): {5.0},
                    (sidecar_id, sig.WAITING): {2.0},
                    (sidecar_id, sig.OLDEST_WAITING_S): {12.5},
                }
                rows = conn.execute(
                    select(Series.target_id, Series.engine_label, Series.signal, Sample.value).join(
                        Sample, Sample.series_id == Series.id
                    )
                ).all()
                seen: dict[tuple[int, str], set[float]] = {}
                for r in rows:
                    seen.setdefault((r.target_id, r.signal), set()).add(r.value)
                    if r.target_id == engine_id:
                        assert r.signal in sig.ENGINE_SIGNALS + sig.TARGET_SIGNALS, r
                    else:
                        assert r.target_id == sidecar_id and r.engine_label == "", r
                        assert r.signal in sig.SIDECAR_SIGNALS + sig.RISK_SIGNALS + sig.TARGET_SIGNALS, r
                for key, values in expected.items():
                    assert seen.get(key) == values, (key, seen.get(key))
                assert seen[(engine_id, sig.UP)] == {1.0} and seen[(sidecar_id, sig.UP)] == {1.0}
                labels = set(
                    conn.execute(
                        select(Series.engine_label)
                        .where(Series.target_id == engine_id)
                        .where(Series.signal == sig.KV_USAGE)
                    ).scalars()
                )
                assert labels == {"0", "1"}
                sessions = conn.execute(
                    select(Session.target_id, func.count())
                    .where(Session.present.is_(True))
                    .group_by(Session.target_id)
                ).all()
                assert [tuple(r) for r in sessions] == [(sidecar_id, 10_000)]
            errors = write_errors(caplog)
            assert errors and all("\n" not in e and "[SQL" not in e for e in errors), errors
            assert any("full" in e for e in errors), errors
        finally:
            rig.close()


def test_one_failing_target_does_not_cost_the_others_their_data(tmp_path, monkeypatch):
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        rig = Rig(f"sqlite:///{tmp_path / 'p.db'}", engine, sidecar)
        try:
            import collectors.store_write as store_module

            real = store_module.write_sidecar

            def broken(conn, tid, o, *caches):  # type: ignore[no-untyped-def]
                raise ValueError("a bug in writing this sidecar's documents")

            monkeypatch.setattr(store_module, "write_sidecar", broken)
            sidecar.add_audit("park")
            rig.tick(3)
            with rig.db.connect() as conn:
                engine_row = conn.execute(
                    select(Target.up, Target.last_scrape_ts).where(Target.url == engine.url)
                ).one()
                assert engine_row.up and engine_row.last_scrape_ts == rig.clock.t
                assert conn.execute(select(func.count()).select_from(AuditEntry)).scalar() == 0
            monkeypatch.setattr(store_module, "write_sidecar", real)
            rig.tick(1)
            assert [i for _, i, _ in rig.audit_ids()] == [1]  # read again, stored once
        finally:
            rig.close()


def test_out_of_range_values_are_null_per_field_with_one_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        rig = Rig(f"sqlite:///{tmp_path / 'p.db'}", engine, sidecar)
        try:
            sidecar.sessions[0].update(context_tokens=1e30, turns=10**30, last_cached_fraction=1e300)
            sidecar.state_overrides.update(
                {"budgeter.demand_tokens": 1e30, "budgeter.pool_tokens": -5, "reuse.token_weighted": 7.5}
            )
            sidecar.audit.append({"id": 10**30, "ts": 1.0, "action": "bogus"})
            sidecar.add_audit("park")  # id 2: fine
            for kv in (-0.5, 7.5, 1e300):
                engine.kv_usage = kv
                rig.tick(2)
            engine.hits_step = 5000.0  # hits above queries
            rig.tick(3)
            rig.tick(5)
            with rig.db.connect() as conn:
                targets = {r.url: r for r in conn.execute(select(Target.url, Target.up, Target.last_error))}
                assert targets[sidecar.url].up and targets[engine.url].up
                s1 = conn.execute(
                    select(Session.context_tokens, Session.turns, Session.last_cached_fraction).where(
                        Session.session_id == "s1"
                    )
                ).one()
                assert tuple(s1) == (None, None, None)
                values = {
                    r.signal: r.value
                    for r in conn.execute(
                        select(Series.signal, Sample.value)
                        .join(Sample, Sample.series_id == Series.id)
                        .where(Series.target_id == rig.tid(sidecar.url))
                    )
                }
                kv_values = set(
                    conn.execute(
                        select(Sample.value)
                        .join(Series, Series.id == Sample.series_id)
                        .where(Series.signal == sig.KV_USAGE)
                    ).scalars()
                )
                hits = conn.execute(
                    select(func.count())
                    .select_from(Sample)
                    .join(Series, Series.id == Sample.series_id)
                    .where(
                        Series.signal.in_([sig.PREFIX_CACHE_HITS_PER_S, sig.ENGINE_HIT_RATIO]),
                        Sample.ts > rig.clock.t - 7,
                    )
                ).scalar()
            assert kv_values <= {0.42}
            assert hits == 0  # hits above queries: neither the hit rate nor the ratio is stored
            assert sig.DEMAND_TOKENS not in values and sig.POOL_TOKENS not in values
            assert sig.TOKEN_WEIGHTED not in values and values[sig.REQUEST_WEIGHTED] > 0
            assert [i for _, i, _ in rig.audit_ids()] == [2]
            warnings = [
                r.getMessage()
                for r in caplog.records
                if r.levelno == logging.WARNING
                and r.name == "collectors.checks"
                and "sidecar.wire" not in r.getMessage()
            ]
            # One warning per field, however many scrapes carried it: KV usage, hits and cached tokens
            # above their totals (engine); demand, pool, R_t (/state); three session fields; one audit id.
            assert len(warnings) == len(set(warnings)) == 10, warnings
            assert any("kv_usage (engine 0) = -0.5" in w for w in warnings), warnings
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        finally:
            rig.close()


def test_collectors_process_under_a_long_lock_loses_nothing_and_stays_quiet(tmp_path):
    """The real process (10 s busy timeout) while another process holds the write lock for 12 s and
    operator actions happen: every audit id arrives once, and the log stays a few lines."""
    import time as _time

    from tests.support import PYTHON, read_log, running

    db_url = f"sqlite:///{tmp_path / 'prefixops.db'}"
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        cmd = [
            PYTHON,
            "-m",
            "collectors",
            "--engine",
            f"e0={engine.url}",
            "--sidecar",
            sidecar.url,
            "--interval",
            "0.5",
            "--database-url",
            db_url,
        ]
        with running(cmd, name="collectors") as proc:
            db = make_engine(db_url)

            def stored() -> list[int]:
                try:
                    with db.connect() as conn:
                        return list(
                            conn.execute(
                                select(AuditEntry.remote_id)
                                .where(AuditEntry.source == "sidecar")
                                .order_by(AuditEntry.remote_id)
                            ).scalars()
                        )
                except Exception:  # noqa: BLE001 - schema not created yet
                    return []

            sidecar.add_audit("first")
            deadline = _time.monotonic() + 30
            while stored() != [1] and _time.monotonic() < deadline:
                _time.sleep(0.2)
            assert stored() == [1]
            before = len(read_log(proc))
            with database_lock(db_url):
                for i in range(12):
                    sidecar.add_audit(f"during-{i}")
                    _time.sleep(1.0)
            while stored() != list(range(1, 14)) and _time.monotonic() < deadline + 40:
                _time.sleep(0.2)
            assert stored() == list(range(1, 14))
            log = read_log(proc)[before:]
            db.dispose()
        errors = [line for line in log.splitlines() if " ERROR " in line]
        print(f"log during a 12 s lock: {len(log)} bytes, {len(errors)} error line(s)")
        assert "Traceback" not in log and "[SQL" not in log, log[-3000:]
        assert 1 <= len(errors) <= 6 and len(log) < 4000, log
        assert all("database is locked" in line for line in errors), errors
