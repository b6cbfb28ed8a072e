"""Who is signed in and what they may do: individual accounts (and OIDC as the option for an identity provider).

Everyone can view every page without signing in. Roles (`core.accounts`): a
``viewer`` reads, an ``operator`` also acts (sidecar controls, acknowledge and
silence alerts), an ``admin`` also manages accounts (the Accounts page).

- **Accounts** (`db.accounts`, managed with ``python -m dashboard accounts ...``
  or by an admin on the Accounts page): the person signs in with their account
  name and password (Argon2id hashes; failed attempts throttled per name and per
  client address, `core.accounts.SignInPolicy`). A successful sign-in creates a
  server-side session whose random token the browser keeps in the
  ``prefixops_session`` cookie (``SameSite=Strict``, ``Max-Age`` the session
  lifetime, ``Secure`` over HTTPS). Streamlit cannot set a cookie from the server,
  so the page sets it with a one-off script (`render_cookie_sync`); on a reload the
  browser sends it with the new connection and `st.context.cookies` hands it back.
  Every script run looks the token up in the database, so sign-out, removal or
  expiry ends it everywhere and a role change applies at once. The cookie holds
  no name and no role: only the token, whose SHA-256 is all the database keeps.
- **OIDC** through `st.login` when ``[auth]`` is configured in
  ``.streamlit/secrets.toml``: the identity (email, else sub) may act when it is in
  ``PREFIXOPS_OPERATOR_ALLOWLIST``; anyone else signed in that way is a viewer.

The audit names the signed-in account (or OIDC identity), never a typed name.
Sign-ins, failures and sign-outs go to the security log (`db.accounts`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from core.accounts import can_act, can_manage_accounts
from dashboard import data
from dashboard.settings import Settings
from db import accounts

logger = logging.getLogger(__name__)

COOKIE = "prefixops_session"
TOKEN_KEY = "session_token"
COOKIE_SYNC_KEY = (
    "session_cookie_pending"  # ("set", token) or ("clear", None): written by the next run's script
)


@dataclass(frozen=True)
class Operator:
    """The signed-in person. `name` is the account name (or OIDC identity): what the audit records."""

    name: str
    method: str  # "password" or "oidc"
    role: str = "viewer"

    @property
    def may_act(self) -> bool:
        return can_act(self.role)

    @property
    def may_manage_accounts(self) -> bool:
        return can_manage_accounts(self.role)


def oidc_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # no secrets file: st.secrets raises instead of being empty
        return False


def _oidc_identity() -> str | None:
    try:
        user: Any = st.user
        if not user.get("is_logged_in"):
            return None
        identity = user.get("email") or user.get("sub")
        return str(identity) if identity else None
    except Exception:
        return None


def client_address() -> str | None:
    try:
        address = st.context.ip_address
    except Exception:
        return None
    return address if isinstance(address, str) and address else None


def _session_token() -> str | None:
    token = st.session_state.get(TOKEN_KEY)
    if isinstance(token, str) and token:
        return token
    pending = st.session_state.get(COOKIE_SYNC_KEY)
    if pending and pending[0] == "clear":
        return None  # signed out in this tab: the cookie this connection arrived with no longer counts
    try:
        cookie = st.context.cookies.get(COOKIE)
    except Exception:
        return None
    return cookie if isinstance(cookie, str) and cookie else None


def current_identity(settings: Settings) -> Operator | None:
    """Whoever is signed in in this browser session (any role), or None."""
    token = _session_token()
    if token:
        try:
            found = accounts.session_identity(data.read_engine(settings.database_url), token)
        except SQLAlchemyError as exc:
            logger.error("could not look up the sign-in session: %s", type(exc).__name__)
            found = None
        if found is not None:
            return Operator(found.name, "password", found.role)
        st.session_state.pop(TOKEN_KEY, None)
    if oidc_configured():
        identity = _oidc_identity()
        if identity:
            role = "operator" if identity.lower() in settings.operator_allowlist else "viewer"
            return Operator(identity, "oidc", role)
    return None


def current_operator(settings: Settings) -> Operator | None:
    """The person allowed to act in this browser session (role operator or admin), or None."""
    who = current_identity(settings)
    return who if who is not None and who.may_act else None


def signed_out_reason(settings: Settings) -> str:
    """Why controls are disabled right now, phrased for the person looking at them."""
    who = current_identity(settings)
    if who is not None and who.method == "oidc":
        return f"Signed in as {who.name}, who is not on the operator allow-list: view only."
    if who is not None:
        return (
            f"Signed in as {who.name} with the viewer role: view only (an operator or admin account can act)."
        )
    return "Sign in as an operator (sidebar) to act; viewing needs no sign-in."


def try_sign_in(
    settings: Settings, name: str, password: str, now: float | None = None
) -> tuple[Operator | None, str]:
    """Check one sign-in attempt; on success the session is kept (and its cookie set on the next run)."""
    if not name.strip() or not password:
        return None, "Type your account name and password."
    try:
        result = accounts.sign_in(
            data.write_engine(settings.database_url), name, password, client=client_address(), now=now
        )
    except SQLAlchemyError as exc:
        logger.error("sign-in failed on a database error: %s", type(exc).__name__)
        return None, (
            f"Sign-in is unavailable: database error {type(exc).__name__} (has the accounts table been "
            "created? `python -m dashboard accounts list` migrates the database)."
        )
    if result.identity is None or result.token is None:
        return None, result.message
    st.session_state[TOKEN_KEY] = result.token
    st.session_state[COOKIE_SYNC_KEY] = ("set", result.token)
    return Operator(result.identity.name, "password", result.identity.role), result.message


def sign_out(settings: Settings) -> Operator | None:
    token = _session_token()
    st.session_state.pop(TOKEN_KEY, None)
    st.session_state[COOKIE_SYNC_KEY] = ("clear", None)
    if not token:
        return None
    try:
        gone = accounts.sign_out(data.write_engine(settings.database_url), token, client=client_address())
    except SQLAlchemyError as exc:
        logger.error("could not end the sign-in session: %s", type(exc).__name__)
        return None
    return Operator(gone.name, "password", gone.role) if gone else None


def cookie_script(action: str, token: str | None, max_age_s: float) -> str:
    """The script that sets (or clears) the session cookie in the browser."""
    if action == "set" and token:
        value = f"{COOKIE}={token}; Path=/; Max-Age={int(max_age_s)}; SameSite=Strict"
    else:
        value = f"{COOKIE}=; Path=/; Max-Age=0; SameSite=Strict"
    return (
        "<script>document.cookie = "
        + json.dumps(value)
        + " + (window.location.protocol === 'https:' ? '; Secure' : '');</script>"
    )


def render_cookie_sync() -> None:
    """Write the last sign-in's or sign-out's cookie change into the browser."""
    pending = st.session_state.get(COOKIE_SYNC_KEY)
    if not pending:
        return
    action, token = pending
    # Rendered on every run until the next sign-in or sign-out (idempotent), so a run cut short by a rerun
    # cannot lose it. A "clear" also tells _session_token to ignore the cookie this connection arrived with.
    st.html(cookie_script(action, token, accounts.DEFAULT_POLICY.session_ttl_s), unsafe_allow_javascript=True)
