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
from db import accounts

logger = logging.getLogger(__name__)


def _no_accounts_hint(settings: Settings) -> str | None:
    """How to create the first account when there is none (None when there are accounts, or on a DB error)."""
    try:
        if accounts.list_accounts(data.read_engine(settings.database_url)):
            return None
    except SQLAlchemyError:
        return None
    return (
        "No accounts yet: create one on the server with "
        "`python -m dashboard accounts add NAME --role admin` (the password is read from standard input)."
    )


def render_sign_in(settings: Settings) -> auth.Operator | None:
    """The sidebar's sign-in block; returns whoever is signed in (any role)."""
    who = auth.current_identity(settings)
    with st.sidebar:
        auth.render_cookie_sync()
        st.subheader("Account")
        if who is not None:
            st.markdown(
                f"Signed in as **{escape_md(who.name)}** ({who.role}"
                + (", single sign-on" if who.method == "oidc" else "")
                + ")"
            )
            if who.method == "password":
                if st.button("Sign out", key="sign_out"):
                    auth.sign_out(settings)
                    st.rerun()
            elif st.button("Log out", key="oidc_logout"):
                st.logout()
            return who
        st.caption(auth.signed_out_reason(settings))
        if data.database_problem(settings.database_url) is None:
            hint = _no_accounts_hint(settings)
            if hint:
                st.caption(hint)
            with st.form("sign_in_form", clear_on_submit=False):
                name = st.text_input("Account", key="sign_in_name", max_chars=64, autocomplete="username")
                password = st.text_input(
                    "Password", type="password", key="sign_in_password", autocomplete="current-password"
                )
                submitted = st.form_submit_button("Sign in")
            if submitted:
                op, message = auth.try_sign_in(settings, name or "", password or "")
                if op is not None:
                    st.rerun()
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
    firing_down = (
        set()
        if alerts.empty
        else {
            int(t)
            for t in alerts[(alerts["state"] == "firing") & (alerts["rule"] == "target-down")]["target_id"]
            if t == t
        }
    )
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
