"""Who may act: sign-in to the dashboard (local passphrase, optional OIDC with an allow-list).

Everyone can view every page. Only a signed-in operator can act. Two ways in:

- **Local operator passphrase** (`PREFIXOPS_OPERATOR_PASSPHRASE`): the person
  types their name and the passphrase; the passphrase is compared in constant
  time (digests of equal length through `hmac.compare_digest`). After
  `MAX_FAILURES` wrong passphrases the form locks for `LOCKOUT_SECONDS`, in that
  browser session and, for that name, in every session of the server process.
- **OIDC** through `st.login` when `[auth]` is configured in
  `.streamlit/secrets.toml`; the identity (email, else sub) must be in
  `PREFIXOPS_OPERATOR_ALLOWLIST`. Signed in but not listed: viewer only.

The name the person signs in with is what the sidecars' audit records
(`X-Actor`), so it is restricted to characters that are safe in a header.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import streamlit as st

from dashboard.settings import Settings

logger = logging.getLogger(__name__)

OPERATOR_KEY = "operator"
FAILURES_KEY = "signin_failures"
LOCKED_UNTIL_KEY = "signin_locked_until"
MAX_FAILURES = 5
LOCKOUT_SECONDS = 30.0
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._@+-]{0,63}$")


@dataclass(frozen=True)
class Operator:
    name: str
    method: str  # "passphrase" or "oidc"


def passphrase_matches(given: str, expected: str) -> bool:
    """Constant-time comparison (digests first, so the length of the secret does not leak)."""
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), hashlib.sha256(expected.encode()).digest())


def validate_name(name: str) -> str | None:
    """Why a sign-in name is unusable, or None when it is fine."""
    if not name.strip():
        return "Type your name: the sidecars' audit records who acted."
    if not NAME_RE.match(name.strip()):
        return ("Use 1-64 ASCII letters, digits, spaces or . _ @ + - (the name is sent to the "
                "sidecars in the X-Actor header).")
    return None


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


def current_operator(settings: Settings) -> Operator | None:
    """The person allowed to act in this browser session, or None (viewer)."""
    op = st.session_state.get(OPERATOR_KEY)
    if isinstance(op, Operator):
        return op
    if oidc_configured():
        identity = _oidc_identity()
        if identity and identity.lower() in settings.operator_allowlist:
            return Operator(identity, "oidc")
    return None


def signed_out_reason(settings: Settings) -> str:
    """Why controls are disabled right now, phrased for the person looking at them."""
    if oidc_configured():
        identity = _oidc_identity()
        if identity:
            return f"Signed in as {identity}, who is not on the operator allow-list: view only."
    if settings.operator_passphrase or oidc_configured():
        return "Sign in as an operator (sidebar) to act; viewing needs no sign-in."
    return ("Controls are off: no operator sign-in is configured on this dashboard "
            "(set PREFIXOPS_OPERATOR_PASSPHRASE on the server).")


@st.cache_resource(show_spinner=False)
def _failures_by_name() -> dict[str, list[float]]:
    """Wrong-passphrase times per sign-in name, across every browser session of this server process.

    A new browser session starts with empty session state, so a per-session counter alone
    would not slow down someone who simply reloads.
    """
    return {}


def _recent_failures(name: str, now: float) -> list[float]:
    times = [t for t in _failures_by_name().get(name.strip().lower(), []) if now - t < LOCKOUT_SECONDS]
    _failures_by_name()[name.strip().lower()] = times
    return times


def try_passphrase_sign_in(settings: Settings, name: str, passphrase: str,
                           now: float | None = None) -> tuple[Operator | None, str]:
    """Check one sign-in attempt; on success the operator is stored in session state.

    Returns the operator (or None) and a message for the person.
    """
    now = time.time() if now is None else now
    locked_until = float(st.session_state.get(LOCKED_UNTIL_KEY, 0.0))
    if now < locked_until:
        return None, f"Too many wrong passphrases; try again in {locked_until - now:.0f} s."
    if not settings.operator_passphrase:
        return None, "Local sign-in is off: PREFIXOPS_OPERATOR_PASSPHRASE is not set on the server."
    problem = validate_name(name)
    if problem:
        return None, problem
    if len(_recent_failures(name, now)) >= MAX_FAILURES:
        return None, f"Too many wrong passphrases for {name.strip()}; try again in up to {LOCKOUT_SECONDS:.0f} s."
    if not passphrase_matches(passphrase, settings.operator_passphrase):
        _recent_failures(name, now).append(now)
        failures = int(st.session_state.get(FAILURES_KEY, 0)) + 1
        st.session_state[FAILURES_KEY] = failures
        logger.warning("dashboard sign-in failed for %r (%d in a row)", name.strip(), failures)
        if failures >= MAX_FAILURES:
            st.session_state[LOCKED_UNTIL_KEY] = now + LOCKOUT_SECONDS
            st.session_state[FAILURES_KEY] = 0
            return None, f"Wrong passphrase. Sign-in locked for {LOCKOUT_SECONDS:.0f} s."
        return None, "Wrong passphrase."
    st.session_state[FAILURES_KEY] = 0
    operator = Operator(name.strip(), "passphrase")
    st.session_state[OPERATOR_KEY] = operator
    logger.info("dashboard sign-in: %r", operator.name)
    return operator, f"Signed in as {operator.name}."


def sign_out() -> Operator | None:
    op = st.session_state.pop(OPERATOR_KEY, None)
    return op if isinstance(op, Operator) else None
