"""The sidebar every page shares: who is signed in (and the sign-in form), collectors' heartbeat."""

from __future__ import annotations

import logging
import time

import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from dashboard import auth, data
from dashboard import frames as q
from dashboard.settings import Settings
from dashboard.status import age_text, collectors_alive
from dashboard.ui import escape_md

logger = logging.getLogger(__name__)


def _audit_sign_in(settings: Settings, name: str, action: str, outcome: str, method: str) -> None:
    try:
        q.write_audit(data.write_engine(settings.database_url), actor=name, action=action, outcome=outcome,
                      params={"method": method})
    except SQLAlchemyError as exc:
        logger.error("could not audit %s of %r: %s", action, name, type(exc).__name__)


def render_sign_in(settings: Settings) -> auth.Operator | None:
    operator = auth.current_operator(settings)
    with st.sidebar:
        st.subheader("Operator")
        if operator is not None:
            st.markdown(f"Signed in as **{escape_md(operator.name)}** ({operator.method})")
            if operator.method == "passphrase":
                if st.button("Sign out", key="sign_out"):
                    gone = auth.sign_out()
                    if gone:
                        _audit_sign_in(settings, gone.name, "sign-out", "ok", gone.method)
                    st.rerun()
            else:
                if st.button("Log out", key="oidc_logout"):
                    st.logout()
            return operator
        st.caption(auth.signed_out_reason(settings))
        if settings.operator_passphrase:
            with st.form("sign_in_form", clear_on_submit=False):
                name = st.text_input("Your name", key="sign_in_name", max_chars=64)
                passphrase = st.text_input("Operator passphrase", type="password", key="sign_in_passphrase")
                submitted = st.form_submit_button("Sign in")
            if submitted:
                op, message = auth.try_passphrase_sign_in(settings, name or "", passphrase or "")
                if op is not None:
                    _audit_sign_in(settings, op.name, "sign-in", "ok", "passphrase")
                    st.rerun()
                else:
                    if name and name.strip() and auth.validate_name(name) is None:
                        _audit_sign_in(settings, name.strip(), "sign-in", f"refused: {message}", "passphrase")
                    st.error(escape_md(message))
        if auth.oidc_configured() and st.button("Sign in with SSO", key="oidc_login"):
            st.login()
    return None


def targets_up(health: dict[int, q.TargetHealth], firing_down: set[int]) -> tuple[int, int, list[str]]:
    """(up, total, names of those down): a target is down when its last scrape failed or the
    ``target-down`` alert fires for it, so this line agrees with the alert."""
    down = sorted(h.name for tid, h in health.items() if not h.up or tid in firing_down)
    return len(health) - len(down), len(health), down


def render_heartbeat(settings: Settings) -> None:
    """Collectors' heartbeat and targets up: a dead collector or a down target shows on every page."""
    if data.database_problem(settings.database_url):
        return
    try:
        beats = data.heartbeats(settings.database_url)
        configured = {ref_id for ref in data.engines(settings.database_url) for ref_id in ref.target_ids}
        health = {tid: h for tid, h in data.health(settings.database_url).items() if tid in configured}
        now = time.time()
        alerts = data.alerts(settings.database_url, now - 86400)
    except data.DatabaseUnavailable:
        return
    firing_down = set() if alerts.empty else {
        int(t) for t in alerts[(alerts["state"] == "firing") & (alerts["rule"] == "target-down")]["target_id"]
        if t == t}
    with st.sidebar:
        st.subheader("Collectors")
        if not beats:
            st.error("No collectors heartbeat recorded: the collectors have never run against this database.")
            return
        up, total, down = targets_up(health, firing_down)
        for beat in beats:
            age = now - beat["last_beat_ts"]
            alive = collectors_alive(beat["last_beat_ts"], now, settings.heartbeat_stale_seconds)
            line = f"{escape_md(beat['name'])}: heartbeat {age_text(age)}"
            if alive:
                st.success(line)
            else:
                st.error(f"{line}. NOT RUNNING: every number on these pages is at least that old.")
        summary = f"{up}/{total} targets up"
        if down:
            st.error(escape_md(summary + ": down " + ", ".join(down[:5]) + (" ..." if len(down) > 5 else "")))
        else:
            st.success(summary)
