"""AppTests of issue 13's triage path: alert cards that lead to the fix, silences from the card and their
expiry, the new state read back after a change, undo of the last budgeter change, an ended session."""

from __future__ import annotations

import json
import time

import httpx
from sqlalchemy import delete, insert, select

from db import make_engine
from db.models import AuditEntry, Sample, Series, Silence, Target
from tests.dashboard.apptest import app, sign_in, texts
from tests.dashboard.fill import COLLAPSE_AGO
from tests.dashboard.test_actions import Recorder, dashboard_audit

STATE_AFTER = {
    "budgeter": {"mode": "off", "low": 0.7, "high": 0.9, "pool_tokens": 400_000, "demand_tokens": 100_000},
    "backlog": {"admitted": 3, "parked": 0, "waiting": 0},
    "reuse": {"regime": "normal"},
}


def plain(at) -> str:  # noqa: ANN001
    return texts(at).replace("\\", "")


def test_alert_cards_lead_to_the_fix(db_url: str, fill_now: float) -> None:
    at = app("alerts")
    links = [(link.proto.label, link.proto.page, link.proto.query_string) for link in at.get("page_link")]
    fix = {
        (label, page.rsplit("/", 1)[-1], query) for label, page, query in links if label.startswith("Fix it")
    }
    assert ("Fix it on the Budgeter page", "budgeter", "engine=a&alert=collapse") in fix
    assert ("Fix it on the Compaction page", "compaction", "engine=a&alert=thin-reuse") in fix
    assert ("Fix it on the Engine page", "engine", "engine=c&alert=target-down") in fix
    text = plain(at)
    for rule in ("collapse", "thin-reuse", "target-down"):
        assert f"Runbook: docs/runbook.md#{rule}" in text
        assert any(e.label.startswith(f"Runbook: {rule}") for e in at.expander)
    # readable values, not raw dicts; the symptom says its cause
    assert "values at firing: hit ratio = 0.10, backlog 120" in text
    assert "{'hit_ratio'" not in text
    assert "A symptom of collapse, firing on the same target" in text
    minutes = round((time.time() - (fill_now - COLLAPSE_AGO + 120)) / 60)
    assert any(
        f"collapse on engine a, firing for {m} min" in text for m in (minutes - 1, minutes, minutes + 1)
    )


def test_silence_from_the_card_then_expire_it(db_url: str) -> None:
    at = sign_in(app())
    at.switch_page("pages/alerts.py").run()
    collapse_button = next(
        b for b in at.button if b.key and b.key.startswith("silence_") and "collapse" in b.label
    )
    collapse_button.click().run()
    assert "Silence rule collapse on engine a for 60 min" in plain(at)
    at.button(key="confirm_action").click().run()
    with make_engine(db_url).connect() as conn:
        rows = conn.execute(select(Silence).where(Silence.rule == "collapse")).all()
    assert len(rows) == 2 and {r.created_by for r in rows} == {"alice"}
    expire = [b for b in at.button if b.key and b.key.startswith("expire_")]
    assert len(expire) == 3  # b's load-test silence and the two new ones
    silence_id = int(expire[0].key.removeprefix("expire_"))
    expire[0].click().run()
    assert "Expire the silence" in plain(at)
    at.button(key="confirm_action").click().run()
    with make_engine(db_url).connect() as conn:
        ended = conn.execute(select(Silence.ends_ts).where(Silence.id == silence_id)).scalar_one()
    assert ended <= time.time()
    assert dashboard_audit(db_url)[-1].action == "alert.unsilence"
    assert len([b for b in at.button if b.key and b.key.startswith("expire_")]) == 2


def test_change_is_read_back_from_the_sidecar_and_undone_in_one_click(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.begin() as conn:
        a_side = conn.execute(select(Target.id).where(Target.name == "a-sidecar")).scalar_one()
        conn.execute(
            insert(AuditEntry).values(
                source="sidecar",
                target_id=a_side,
                remote_id=99,
                ts=time.time() - 60,
                actor="oncall-sre",
                action="budgeter.update",
                params={"mode": "budgeter-park"},
                outcome="ok",
                data={
                    "before": {"mode": "off", "low": 0.7, "high": 0.9},
                    "after": {"mode": "budgeter-park", "low": 0.75, "high": 0.95},
                },
            )
        )
    recorder = Recorder(lambda r: httpx.Response(200, json={"budgeter": {}}), state=STATE_AFTER).install()
    at = sign_in(app(engine="a"))
    at.switch_page("pages/budgeter.py").run()
    assert "oncall-sre at" in plain(at) and "mode off -> budgeter-park" in plain(at)
    at.button(key="budgeter_undo").click().run()
    assert "Undo oncall-sre's budgeter change" in plain(at)
    at.button(key="confirm_action").click().run()
    sent = recorder.requests[-1]
    assert (sent.method, sent.url.path) == ("PUT", "/control/budgeter")
    assert json.loads(sent.content) == {"mode": "off", "low": 0.7, "high": 0.9}
    assert recorder.reads, "the new state was not read back"
    text = plain(at)
    assert "now, read back from the sidecar: budgeter off bands 0.7-0.9" in text
    assert "read back right after your change" in text
    assert at.metric[0].value == "off"  # the page shows the new mode at once, not the last scrape's
    undo = dashboard_audit(db_url)[-1]
    assert (undo.action, undo.actor, undo.params["mode"]) == ("budgeter.undo", "alice", "off")


def test_parking_an_ended_session_says_it_ended(db_url: str) -> None:
    Recorder(lambda r: httpx.Response(404, json={"error": {"message": "unknown session"}})).install()
    at = sign_in(app(engine="a"))
    at.switch_page("pages/sessions.py").run()
    at.multiselect(key="sessions_selected").set_value(["agent-012"]).run()
    at.button(key="park_selected").click().run()
    at.button(key="confirm_action").click().run()
    assert "session agent-012 has ended (the sidecar no longer tracks it): nothing to park" in plain(at)


def test_destructive_picker_has_no_select_all(db_url: str) -> None:
    at = sign_in(app(engine="a"))
    at.switch_page("pages/sessions.py").run()
    assert at.multiselect(key="sessions_selected").proto.select_all == 0


def test_frozen_engine_stops_the_sidecar_reuse_lines_and_shades_them(
    db_url: str, fill_now: float, monkeypatch
) -> None:  # noqa: ANN001
    """kill -STOP on the engine: the sidecar still answers with its last R_t; the chart must not draw it on."""
    monkeypatch.setenv("PREFIXOPS_STALE_SECONDS", str(time.time() - fill_now + 60))  # fresh as of the fill
    import pandas as pd
    from sqlalchemy import update

    from tests.dashboard.apptest import figures, traces

    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            update(Target)
            .where(Target.name == "b")
            .values(up=False, last_success_ts=fill_now - 600, last_error="ReadTimeout")
        )
        b_engine = conn.execute(select(Target.id).where(Target.name == "b")).scalar_one()
        series = select(Series.id).where(Series.target_id == b_engine)
        conn.execute(delete(Sample).where(Sample.series_id.in_(series), Sample.ts > fill_now - 600))
    at = app("engine", engine="b")
    fig = figures(at)["engine_hit_rates"]
    hit = traces(fig)
    last_rt = pd.Timestamp(
        [
            x
            for x, y in zip(hit["R_t (token-weighted)"]["x"], hit["R_t (token-weighted)"]["y"], strict=True)
            if y is not None
        ][-1]
    ).timestamp()
    assert last_rt <= fill_now - 600
    assert any(s.get("type") == "rect" and s.get("fillcolor") == "#9e9e9e" for s in fig["layout"]["shapes"])
    assert any(str(a.get("text", "")).startswith("no data since") for a in fig["layout"]["annotations"])
    # the queue at the sidecar keeps going: users piling up is what to see
    backlog = traces(figures(at)["engine_backlog"])
    assert pd.Timestamp(backlog["waiting"]["x"][-1]).timestamp() > fill_now - 60
