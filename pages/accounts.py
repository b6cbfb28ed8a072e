"""Accounts (admins only): who may sign in and with which role; the security log of sign-ins and changes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from core.accounts import ROLES, AccountError
from dashboard import auth, data
from dashboard.settings import Settings
from dashboard.ui import ensure_router, escape_md, fmt_ts, require_database
from db import accounts

ensure_router()
settings = Settings.from_env()
st.title("Accounts")
require_database(settings)
admin = auth.current_identity(settings)
if admin is None or not admin.may_manage_accounts:
    st.warning(
        "Only an admin account can manage accounts. "
        + (
            "Sign in (sidebar) with an admin account."
            if admin is None
            else f"{admin.name} has the {admin.role} role."
        )
    )
    st.stop()
engine = data.write_engine(settings.database_url)
NOTE_KEY = "accounts_note"


def _done(ok: bool, message: str) -> None:
    st.session_state[NOTE_KEY] = (ok, message)
    st.rerun()


def _change(fn: Callable[..., Any], *args: Any, success: str) -> None:
    try:
        fn(engine, *args, actor=admin.name, method="dashboard", client=auth.client_address())
    except AccountError as exc:
        _done(False, str(exc))
    except SQLAlchemyError as exc:
        _done(False, f"Database error {type(exc).__name__}: nothing changed.")
    _done(True, success)


note = st.session_state.pop(NOTE_KEY, None)
if note:
    (st.success if note[0] else st.error)(escape_md(note[1]))

try:
    rows = accounts.list_accounts(engine)
except SQLAlchemyError as exc:
    st.error(f"Cannot read the accounts table ({type(exc).__name__}): has the database been migrated?")
    st.stop()
st.caption(
    f"{len(rows)} account(s). Viewers read; operators also act and silence alerts; admins also manage "
    "accounts here or with `python -m dashboard accounts ...` on the server."
)
st.dataframe(
    pd.DataFrame(
        {
            "account": [r["name"] for r in rows],
            "role": [r["role"] for r in rows],
            "created (UTC)": [fmt_ts(r["created_ts"]) for r in rows],
            "created by": [r["created_by"] or "" for r in rows],
            "last sign-in (UTC)": [
                fmt_ts(r["last_sign_in_ts"]) if r["last_sign_in_ts"] else "never" for r in rows
            ],
            "signed-in sessions": [r["sessions"] for r in rows],
        }
    ),
    hide_index=True,
    width="stretch",
    key="accounts_table",
)

names = [r["name"] for r in rows]
add_col, change_col = st.columns(2)
with add_col, st.form("account_add", clear_on_submit=True):
    st.subheader("Add an account")
    new_name = st.text_input("Account name", key="account_new_name", max_chars=64)
    new_role = st.selectbox("Role", ROLES, index=1, key="account_new_role")
    new_password = st.text_input(
        "Password (at least 12 characters)",
        type="password",
        key="account_new_password",
        autocomplete="new-password",
    )
    again = st.text_input(
        "Password again", type="password", key="account_new_password2", autocomplete="new-password"
    )
    if st.form_submit_button("Add account"):
        if new_password != again:
            _done(False, "The two passwords differ: nothing changed.")
        _change(
            accounts.add_account,
            new_name or "",
            new_role,
            new_password or "",
            success=f"Added {(new_name or '').strip().lower()} ({new_role}).",
        )

with change_col:
    st.subheader("Change or remove")
    chosen = st.selectbox(
        "Account to change", names, key="account_chosen", index=None, placeholder="Choose an account"
    )
    role = st.selectbox("New role", ROLES, key="account_role")
    cols = st.columns(2)
    if cols[0].button("Change role", key="account_set_role", disabled=chosen is None):
        _change(accounts.set_role, chosen, role, success=f"{chosen} is now {role}.")
    sure = st.checkbox(
        "Yes, remove this account and end its sessions", key="account_remove_sure", disabled=chosen is None
    )
    if cols[1].button("Remove account", key="account_remove", disabled=chosen is None or not sure):
        _change(accounts.remove_account, chosen, success=f"Removed {chosen}.")

st.subheader("Security log (last 7 days)")
events = accounts.security_events(engine, since=time.time() - 7 * 86400, limit=500)
if not events:
    st.caption("No sign-ins or account changes recorded.")
else:
    st.dataframe(
        pd.DataFrame(
            {
                "time (UTC)": [fmt_ts(e["ts"]) for e in events],
                "event": [e["event"] for e in events],
                "account": [e["account"] or "" for e in events],
                "outcome": [e["outcome"] for e in events],
                "by": [e["actor"] or "" for e in events],
                "via": [e["method"] or "" for e in events],
                "client": [e["client"] or "" for e in events],
            }
        ),
        hide_index=True,
        width="stretch",
        key="security_log",
    )
