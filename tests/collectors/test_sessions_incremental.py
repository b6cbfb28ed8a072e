"""The collectors read a sidecar's /sessions incrementally (issue 11 item 8).

`GET /sessions?updated_after=TS&limit=N` pages ``{"sessions": [...], "next": CURSOR}``; the
collectors follow ``next`` (as ``cursor``), keep the newest ``updated_at`` they stored, and
ask only for what changed since. A full listing every `SidecarScraper.FULL_EVERY_S` (and after
a sidecar restart) marks the sessions a sidecar no longer lists. A sidecar answering the old
whole-list form is still read.
"""

from __future__ import annotations

import time

from sqlalchemy import func, select

from collectors.scrape_sidecar import SidecarScraper
from core import signals as sig
from db.models import Sample, Series, Session
from tests.collectors.fake_targets import FakeEngine, FakeSidecar
from tests.collectors.test_write_faults import Rig


def present(rig: Rig) -> dict[str, str | None]:
    with rig.db.connect() as conn:
        return dict(
            conn.execute(select(Session.session_id, Session.state).where(Session.present.is_(True))).all()
        )


def sessions_requests(sidecar: FakeSidecar) -> list[str]:
    return [p for p in sidecar.paths if p.startswith("/sessions")]


def test_only_changed_sessions_are_read(tmp_path):
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        rig = Rig(f"sqlite:///{tmp_path / 'p.db'}", engine, sidecar)
        try:
            sidecar.set_sessions(10_000)
            sidecar.paths.clear()
            before = sidecar.bytes_sent
            rig.tick()
            full_bytes = sidecar.bytes_sent - before
            assert len(sessions_requests(sidecar)) == 10  # ten pages of 1000, following `next`
            assert len(present(rig)) == 10_000

            sidecar.paths.clear()
            before = sidecar.bytes_sent
            rig.tick()
            idle_bytes = sidecar.bytes_sent - before
            assert [p.split("&")[0].split("=")[0] for p in sessions_requests(sidecar)] == [
                "/sessions?updated_after"
            ]

            now = time.time()
            for s in sidecar.sessions[:3]:
                s.update(state="parked", updated_at=now + 1)
            sidecar.paths.clear()
            rig.tick()
            assert len(sessions_requests(sidecar)) == 1
            rows = present(rig)
            assert len(rows) == 10_000 and [rows[f"agent-{i}"] for i in range(4)] == ["parked"] * 3 + [
                "admitted"
            ]
            # Ended sessions come as changes too.
            sidecar.sessions[5].update(state="ended", updated_at=now + 2)
            rig.tick()
            assert "agent-5" not in present(rig) and len(present(rig)) == 9_999
            print(
                f"/sessions bytes per cycle with 10,000 sessions: full {full_bytes}, unchanged {idle_bytes}"
            )
            assert idle_bytes * 50 < full_bytes
        finally:
            rig.close()


def test_full_listing_marks_forgotten_sessions_and_old_sidecars_still_work(tmp_path):
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        rig = Rig(f"sqlite:///{tmp_path / 'p.db'}", engine, sidecar)
        try:
            sidecar.set_sessions(5)
            rig.tick(2)
            assert len(present(rig)) == 5
            del sidecar.sessions[0]  # gone without an "ended" record (evicted, or a sidecar restart)
            rig.tick()
            assert len(present(rig)) == 5  # an incremental read cannot know
            rig.clock.t += SidecarScraper.FULL_EVERY_S
            rig.tick()
            assert sorted(present(rig)) == [f"agent-{i}" for i in range(1, 5)]
            # A restarted sidecar is listed in full at once.
            sidecar.started_at += 10
            del sidecar.sessions[0]
            rig.tick()
            assert sorted(present(rig)) == [f"agent-{i}" for i in range(2, 5)]
            # A sidecar without pages answers the whole list to every query: still read, still complete.
            sidecar.paged = False
            del sidecar.sessions[0]
            rig.tick(2)
            assert sorted(present(rig)) == ["agent-3", "agent-4"]
        finally:
            rig.close()


def test_the_fake_sidecar_speaks_the_wire_contracts():
    """The fake stands in for the real sidecar only while its documents match sidecar/wire.py."""
    from sidecar import wire

    sidecar = FakeSidecar()
    sidecar.add_audit("park")
    sidecar.add_decision("granted")
    wire.StateDoc.model_validate(sidecar.state())
    for doc in sidecar.sessions:
        wire.SessionDoc.model_validate(doc)
    wire.SessionsPage.model_validate(sidecar.sessions_body({"limit": ["1"]}))
    wire.AuditEntry.model_validate(sidecar.audit[0])
    wire.DecisionDoc.model_validate(sidecar.decisions[0])


def test_backlog_ages_are_signals(tmp_path):
    with FakeEngine() as engine, FakeSidecar() as sidecar:
        rig = Rig(f"sqlite:///{tmp_path / 'p.db'}", engine, sidecar)
        try:
            sidecar.state_overrides.update(
                {"backlog.oldest_waiting_s": 75.5, "backlog.oldest_parked_s": 12.0}
            )
            rig.tick()
            sidecar.state_overrides.update(
                {"backlog.oldest_waiting_s": None, "backlog.oldest_parked_s": None}
            )
            rig.tick()
            with rig.db.connect() as conn:
                rows = conn.execute(
                    select(Series.signal, func.group_concat(Sample.value))
                    .join(Sample, Sample.series_id == Series.id)
                    .where(Series.signal.in_([sig.OLDEST_WAITING_S, sig.OLDEST_PARKED_S]))
                    .group_by(Series.signal)
                ).all()
            # Nobody waiting is 0 (so admission-wait resolves); nobody parked is no sample.
            assert dict(rows) == {sig.OLDEST_WAITING_S: "75.5,0.0", sig.OLDEST_PARKED_S: "12.0"}
        finally:
            rig.close()
