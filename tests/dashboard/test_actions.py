"""AppTests of the control actions: roles, confirmation dialogs, results and errors, audit rows."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import delete, select

from dashboard import data
from dashboard.actions import PENDING_KEY, Action
from db import make_engine
from db.models import Account, Alert, AuditEntry, SecurityEvent, Silence
from tests.dashboard.apptest import app, sign_in, texts

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A fake sidecar control API: records requests, answers with `respond`."""

    def __init__(self, respond: Handler | None = None, state: dict | None = None) -> None:
        self.requests: list[httpx.Request] = []  # control requests
        self.reads: list[httpx.Request] = []  # GET /state: the read-back after a change
        self.respond = respond or (lambda request: httpx.Response(200, json={"ok": True}))
        self.state = state

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/state":
            self.reads.append(request)
            if self.state is not None:
                return httpx.Response(200, json=self.state)
            return self.respond(request)
        self.requests.append(request)
        return self.respond(request)

    def install(self) -> Recorder:
        data.transport_override = httpx.MockTransport(self)
        return self


def dashboard_audit(db_url: str) -> list[AuditEntry]:
    with make_engine(db_url).connect() as conn:
        return list(
            conn.execute(
                select(AuditEntry).where(AuditEntry.source == "dashboard").order_by(AuditEntry.id)
            ).all()
        )


# ------------------------------------------------------------------------- sign-in and roles
def test_signed_out_every_control_is_disabled_with_the_reason(db_url: str) -> None:
    for page, keys in (
        ("sessions", ["park_selected", "unpark_selected"]),
        ("budgeter", ["budgeter_apply"]),
        ("compaction", ["defer_compaction", "allow_compaction"]),
        ("alerts", ["silence_add"]),
    ):
        at = app(page, engine="a")
        for key in keys:
            assert at.button(key=key).disabled, (page, key)
        assert "Sign in as an operator" in texts(at), page
    at = app("alerts")
    assert all(b.disabled for b in at.button if b.key and b.key.startswith("ack_"))


def security_log(db_url: str) -> list[SecurityEvent]:
    with make_engine(db_url).connect() as conn:
        return list(conn.execute(select(SecurityEvent).order_by(SecurityEvent.id)).all())


def test_no_accounts_yet_says_how_to_create_one(db_url: str) -> None:
    with make_engine(db_url).begin() as conn:
        conn.execute(delete(Account))
    at = app("sessions", engine="a")
    assert "python -m dashboard accounts add NAME --role admin" in texts(at)
    assert at.button(key="park_selected").disabled


def test_wrong_password_is_refused_and_goes_to_the_security_log_not_the_audit(db_url: str) -> None:
    before = len(dashboard_audit(db_url))
    at = sign_in(app(), passphrase="guess-guess-guess")
    assert "Wrong account name or password" in texts(at)
    assert "session_token" not in at.session_state
    row = security_log(db_url)[-1]
    assert (row.event, row.account, row.outcome, row.method) == (
        "sign-in",
        "alice",
        "wrong password",
        "password",
    )
    assert "guess" not in json.dumps([[r.detail, r.outcome] for r in security_log(db_url)])
    at = sign_in(app(), name="nobody")
    assert "Wrong account name or password" in texts(at)  # the same words: no hint that the name is unknown
    assert security_log(db_url)[-1].outcome == "unknown account"
    assert len(dashboard_audit(db_url)) == before


def test_sign_in_with_an_account_goes_to_the_security_log_and_acts_as_that_account(db_url: str) -> None:
    before = len(dashboard_audit(db_url))
    at = sign_in(app(), name=" Alice ")  # names compare case-insensitively
    assert "Signed in as" in texts(at) and "alice" in texts(at) and "(operator)" in texts(at)
    row = security_log(db_url)[-1]
    assert (row.event, row.account, row.outcome) == ("sign-in", "alice", "ok")
    assert len(dashboard_audit(db_url)) == before  # sign-ins are not control actions
    at.switch_page("pages/sessions.py").run()
    assert not at.multiselect(key="sessions_selected").disabled
    at.sidebar.button(key="sign_out").click().run()
    assert security_log(db_url)[-1].event == "sign-out"
    assert at.multiselect(key="sessions_selected").disabled


def test_a_viewer_reads_but_cannot_act(db_url: str) -> None:
    at = sign_in(app("sessions", engine="a"), name="vera")
    assert "(viewer)" in texts(at)
    assert at.button(key="park_selected").disabled
    assert "viewer role: view only" in texts(at)
    at.switch_page("pages/compaction.py").run()
    assert at.button(key="defer_compaction").disabled


def test_sign_in_locks_after_repeated_wrong_passwords(db_url: str) -> None:
    at = app()
    for _ in range(5):
        sign_in(at, passphrase="wrong-wrong-wrong")
    sign_in(at)  # the right password, but locked
    assert "try again in" in texts(at)
    assert "session_token" not in at.session_state
    assert security_log(db_url)[-1].outcome == "locked"


def test_name_with_header_breaking_characters_is_refused(db_url: str) -> None:
    at = sign_in(app(), name="eve\r\nX-Evil: 1")
    assert "Wrong account name or password" in texts(at)
    assert "session_token" not in at.session_state


def test_pending_action_cannot_be_confirmed_when_signed_out(db_url: str) -> None:
    recorder = Recorder().install()
    at = app()
    at.session_state[PENDING_KEY] = Action(
        kind="park",
        effect="Park 1 session(s) on engine a",
        engine="a",
        sidecar_url="http://127.0.0.1:18100",
        session_ids=("agent-010",),
    )
    at.run()
    assert at.button(key="confirm_action").disabled
    assert "not signed in as an operator" in texts(at)
    assert recorder.requests == []


# ------------------------------------------------------------------------------ sessions
def _park(at, ids: list[str]):  # noqa: ANN001, ANN202
    at.switch_page("pages/sessions.py").run()
    at.multiselect(key="sessions_selected").set_value(ids).run()
    at.button(key="park_selected").click().run()
    return at


def test_park_two_sessions_confirms_the_effect_then_sends_as_the_person(db_url: str) -> None:
    recorder = Recorder(lambda r: httpx.Response(200, json={"session": {"state": "parked"}})).install()
    at = _park(sign_in(app(engine="a")), ["agent-010", "agent-011"])
    assert recorder.requests == []  # nothing sent before confirmation
    assert "Park 2 session\\(s\\) on engine a" in texts(at)
    at.button(key="confirm_action").click().run()
    assert [r.url.path for r in recorder.requests] == [
        "/control/sessions/agent-010/park",
        "/control/sessions/agent-011/park",
    ]
    assert all(r.headers["authorization"] == "Bearer test-operator-token" for r in recorder.requests)
    assert all(r.headers["x-actor"] == "alice" for r in recorder.requests)
    assert str(recorder.requests[0].url).startswith("http://127.0.0.1:18100/")
    assert "parked 2 of 2 session" in texts(at)
    assert PENDING_KEY not in at.session_state


def test_cancel_sends_nothing(db_url: str) -> None:
    recorder = Recorder().install()
    at = _park(sign_in(app(engine="a")), ["agent-010"])
    at.button(key="cancel_action").click().run()
    assert recorder.requests == []
    assert PENDING_KEY not in at.session_state


def test_unpark_with_pin_sends_the_pin(db_url: str) -> None:
    recorder = Recorder().install()
    at = sign_in(app(engine="a"))
    at.switch_page("pages/sessions.py").run()
    at.multiselect(key="sessions_selected").set_value(["agent-000"]).run()
    at.checkbox(key="sessions_pin").check().run()
    at.button(key="unpark_selected").click().run()
    assert "pinned" in texts(at)
    at.button(key="confirm_action").click().run()
    assert recorder.requests[0].url.path == "/control/sessions/agent-000/unpark"
    assert json.loads(recorder.requests[0].content) == {"pin": True}


def test_session_id_is_url_quoted_and_shown_as_text(db_url: str) -> None:
    recorder = Recorder().install()
    nasty = "<b>sess</b>*md* [x](javascript:alert(1))"
    at = _park(sign_in(app(engine="a")), [nasty])
    at.button(key="confirm_action").click().run()
    assert recorder.requests[0].url.raw_path.startswith(b"/control/sessions/%3Cb%3Esess%3C%2Fb%3E")
    table = at.dataframe[0].value
    assert nasty in set(table["session"])


def test_sidecar_down_gives_a_clear_message_and_an_audit_row(db_url: str) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    Recorder(refuse).install()
    at = _park(sign_in(app(engine="a")), ["agent-010"])
    at.button(key="confirm_action").click().run()
    assert not at.exception
    message = texts(at)
    assert "not reachable" in message and "Nothing was applied" in message
    assert "Traceback" not in message
    row = dashboard_audit(db_url)[-1]
    assert (row.actor, row.action) == ("alice", "park") and "not reachable" in row.outcome


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            401,
            {"error": {"type": "unauthorized", "message": "operator token not accepted"}},
            "rejected the dashboard",
        ),
        (
            404,
            {"error": {"type": "unknown_session", "message": "unknown session 'agent-010'"}},
            "unknown session",
        ),
        (503, {"error": {"message": "overloaded"}}, "HTTP 503"),
    ],
)
def test_sidecar_errors_are_shown_and_audited(db_url: str, status: int, body: dict, expected: str) -> None:
    Recorder(lambda r: httpx.Response(status, json=body)).install()
    at = _park(sign_in(app(engine="a")), ["agent-010"])
    at.button(key="confirm_action").click().run()
    assert expected in texts(at).replace("\\", "")
    assert "test-operator-token" not in texts(at)
    assert expected in dashboard_audit(db_url)[-1].outcome


def test_partial_failure_says_which_session_failed(db_url: str) -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        if "agent-011" in request.url.path:
            return httpx.Response(404, json={"error": {"message": "unknown session 'agent-011'"}})
        return httpx.Response(200, json={})

    Recorder(respond).install()
    at = _park(sign_in(app(engine="a")), ["agent-010", "agent-011"])
    at.button(key="confirm_action").click().run()
    assert "parked 1 of 2" in texts(at)
    assert any("agent-011" in t.value for t in at.text)


def test_no_operator_token_sends_nothing(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFIXOPS_OPERATOR_TOKEN")
    recorder = Recorder().install()
    at = _park(sign_in(app(engine="a")), ["agent-010"])
    at.button(key="confirm_action").click().run()
    assert recorder.requests == []
    assert "No operator token is configured" in texts(at)


def test_token_comes_from_the_collectors_config_per_sidecar(
    db_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "prefixops.toml"
    config.write_text('[[sidecars]]\nurl = "http://127.0.0.1:18100"\noperator_token = "per-sidecar-token"\n')
    monkeypatch.setenv("PREFIXOPS_CONFIG", str(config))
    recorder = Recorder().install()
    at = _park(sign_in(app(engine="a")), ["agent-010"])
    at.button(key="confirm_action").click().run()
    assert recorder.requests[0].headers["authorization"] == "Bearer per-sidecar-token"


# ------------------------------------------------------------------------------ budgeter
def test_budgeter_rejects_bad_bands_before_sending(db_url: str) -> None:
    Recorder().install()
    at = sign_in(app(engine="a"))
    at.switch_page("pages/budgeter.py").run()
    at.number_input(key="budgeter_low").set_value(0.9).run()
    at.number_input(key="budgeter_high").set_value(0.8).run()
    assert "low band must be below high band" in texts(at)
    assert at.button(key="budgeter_apply").disabled
    at.number_input(key="budgeter_high").set_value(1.2).run()
    assert "high band must be above 0 and at most 1" in texts(at)
    assert at.button(key="budgeter_apply").disabled


def test_budgeter_preview_and_apply(db_url: str) -> None:
    recorder = Recorder(lambda r: httpx.Response(200, json={"budgeter": {}})).install()
    at = sign_in(app(engine="a"))
    at.switch_page("pages/budgeter.py").run()
    # Current bands 0.75/0.95 with demand at 99% of the pool: the preview parks the newest sessions.
    parked_now = list(at.dataframe[0].value["session"])
    assert parked_now and parked_now[0] == "agent-025"
    at.number_input(key="budgeter_low").set_value(0.4).run()
    at.number_input(key="budgeter_high").set_value(0.5).run()
    parked_lower = list(at.dataframe[0].value["session"])
    assert len(parked_lower) > len(parked_now)
    assert "agent-010" not in parked_lower  # pinned sessions are never parked automatically
    assert recorder.requests == []
    at.button(key="budgeter_apply").click().run()
    assert "bands 0.40-0.50 (now budgeter-park, 0.75-0.95)" in texts(at).replace("\\", "")
    at.button(key="confirm_action").click().run()
    sent = recorder.requests[-1]
    assert (sent.method, sent.url.path) == ("PUT", "/control/budgeter")
    assert json.loads(sent.content) == {"low": 0.4, "high": 0.5}


def test_budgeter_refusal_names_the_field(db_url: str) -> None:
    Recorder(
        lambda r: httpx.Response(
            422,
            json={
                "error": {
                    "type": "invalid_value",
                    "message": "high band must be above 0 and at most 1, got 2",
                    "field": "high",
                }
            },
        )
    ).install()
    at = sign_in(app(engine="a"))
    at.switch_page("pages/budgeter.py").run()
    at.selectbox(key="budgeter_mode").set_value("admission-only").run()
    at.button(key="budgeter_apply").click().run()
    at.button(key="confirm_action").click().run()
    assert "high band must be above 0" in texts(at).replace("\\", "")


# ----------------------------------------------------------------------------- compaction
def test_defer_and_allow_compaction(db_url: str) -> None:
    recorder = Recorder().install()
    at = sign_in(app(engine="a"))
    at.switch_page("pages/compaction.py").run()
    at.selectbox(key="defer_minutes").set_value(30).run()
    at.text_input(key="defer_reason").input("storm in progress").run()
    at.button(key="defer_compaction").click().run()
    assert "for 30 minutes" in texts(at)
    at.button(key="confirm_action").click().run()
    assert recorder.requests[-1].url.path == "/control/compaction/defer"
    assert json.loads(recorder.requests[-1].content) == {"minutes": 30, "reason": "storm in progress"}
    at.button(key="allow_compaction").click().run()
    at.button(key="confirm_action").click().run()
    assert recorder.requests[-1].url.path == "/control/compaction/allow"


# --------------------------------------------------------------------------------- alerts
def test_acknowledge_alert_writes_who_and_audits(db_url: str) -> None:
    at = sign_in(app())
    at.switch_page("pages/alerts.py").run()
    engine = make_engine(db_url)
    with engine.connect() as conn:
        collapse_id = conn.execute(select(Alert.id).where(Alert.rule == "collapse")).scalar_one()
    at.button(key=f"ack_{collapse_id}").click().run()
    at.button(key="confirm_action").click().run()
    with engine.connect() as conn:
        alert = conn.execute(select(Alert).where(Alert.id == collapse_id)).one()
    assert alert.acknowledged_by == "alice"
    assert dashboard_audit(db_url)[-1].action == "alert.acknowledge"
    assert at.button(key=f"ack_{collapse_id}").disabled  # acknowledged now


def test_silence_a_rule_on_an_engine(db_url: str) -> None:
    at = sign_in(app())
    at.switch_page("pages/alerts.py").run()
    at.selectbox(key="silence_rule").set_value("thin-reuse").run()
    at.selectbox(key="silence_engine").set_value("a").run()
    at.selectbox(key="silence_minutes").set_value(240).run()
    at.button(key="silence_add").click().run()
    assert "Silence rule thin\\-reuse on engine a for 240 min" in texts(at)
    at.button(key="confirm_action").click().run()
    with make_engine(db_url).connect() as conn:
        rows = conn.execute(select(Silence).where(Silence.rule == "thin-reuse")).all()
    assert len(rows) == 2 and {r.created_by for r in rows} == {"alice"}
    assert all(abs((r.ends_ts - r.starts_ts) - 240 * 60) < 1 for r in rows)
    assert dashboard_audit(db_url)[-1].action == "alert.silence"


# ------------------------------------------------------------------------------------ OIDC
AUTH_SECRETS = {
    "auth": {
        "redirect_uri": "http://127.0.0.1:8501/oauth2callback",
        "cookie_secret": "x" * 32,
        "client_id": "prefixops",
        "client_secret": "s",
        "server_metadata_url": "https://idp.invalid/.well-known/openid-configuration",
    }
}


@pytest.mark.parametrize(("email", "allowed"), [("ops@example.com", True), ("visitor@example.com", False)])
def test_oidc_sign_in_acts_only_for_the_allow_list(
    db_url: str, monkeypatch: pytest.MonkeyPatch, email: str, allowed: bool
) -> None:
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.conftest import APP

    monkeypatch.setenv("PREFIXOPS_OPERATOR_ALLOWLIST", "ops@example.com")
    recorder = Recorder().install()
    at = AppTest.from_file(APP, default_timeout=60)
    at.secrets = AUTH_SECRETS
    at.user = {"is_logged_in": True, "email": email}
    at.run()
    at.switch_page("pages/compaction.py").run()
    assert at.button(key="defer_compaction").disabled != allowed
    if allowed:
        assert "Signed in as" in texts(at)
        at.button(key="defer_compaction").click().run()
        at.button(key="confirm_action").click().run()
        assert recorder.requests[-1].headers["x-actor"] == "ops@example.com"
    else:
        assert "not on the operator allow-list" in texts(at)


def test_lockout_for_a_name_survives_a_new_browser_session(db_url: str) -> None:
    first = app()
    for _ in range(5):
        sign_in(first, name="alice", passphrase="wrong-wrong-wrong")
    second = sign_in(app(), name="alice")  # a fresh session, the right password
    assert "Too many failed sign" in texts(second) and "try again in" in texts(second)
    assert "session_token" not in second.session_state
