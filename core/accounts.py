"""Operator accounts: names, roles, password rules and the sign-in throttle (pure; the clock is passed in).

Roles, each including the one before it:

| role | may |
|---|---|
| ``viewer`` | read every page |
| ``operator`` | also act: park/unpark, budgeter, compaction, acknowledge and silence alerts |
| ``admin`` | also manage accounts (add, remove, change role) |

An account name is 1-64 characters: ASCII letters, digits and ``. _ @ + -``,
starting with a letter or digit, compared case-insensitively (stored in lower
case). It is the identity the audit records and the sidecars receive in the
``X-Actor`` header, so nothing outside that set (spaces, CR/LF, non-ASCII) is
accepted. A password is at least ``MIN_PASSWORD_LENGTH`` (12) characters and
at most ``MAX_PASSWORD_LENGTH`` (1024).

**Sign-in throttle** (`SignInPolicy`, `lockout_remaining`). Wrong passwords are
counted over a sliding window of ``window_s`` seconds (default 300), for the
account name typed and, separately, for the client address. Once
``max_failures_per_name`` (5) failures for one name, or
``max_failures_per_client`` (20) from one client, fall inside the window,
further attempts for it are refused without checking the password until the
oldest of those failures leaves the window. Only wrong passwords count, not
refused (locked) attempts, so an attacker cannot keep a name locked beyond one
window past their last real guess. Example: failures at t = 0, 10, 20, 30, 40
for one name lock it at t = 40 until t = 300 (`lockout_remaining` = 260 at
t = 40); at t = 300 the failure at t = 0 has left the window and one more try
is allowed.

A sign-in session lasts ``session_ttl_s`` (default 12 h) from sign-in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

ROLES = ("viewer", "operator", "admin")
ACTING_ROLES = frozenset({"operator", "admin"})
MANAGING_ROLES = frozenset({"admin"})
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._@+-]{0,63}$")
MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024


class AccountError(ValueError):
    """An account name, role or password that cannot be used; the message says which and why."""


def normalize_name(name: str) -> str:
    """The stored form of an account name (stripped, lower case), or AccountError saying what is wrong."""
    cleaned = name.strip().lower()
    if not NAME_RE.match(cleaned):
        raise AccountError(
            f"account name {name!r} is not usable: use 1-64 ASCII letters, digits or . _ @ + -, "
            "starting with a letter or digit (it is sent to the sidecars in the X-Actor header)"
        )
    return cleaned


def check_role(role: str) -> str:
    if role not in ROLES:
        raise AccountError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def check_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AccountError(
            f"password too short: {len(password)} characters, at least {MIN_PASSWORD_LENGTH} needed"
        )
    if len(password) > MAX_PASSWORD_LENGTH:
        raise AccountError(f"password too long: {len(password)} characters, at most {MAX_PASSWORD_LENGTH}")
    return password


def can_act(role: str | None) -> bool:
    return role in ACTING_ROLES


def can_manage_accounts(role: str | None) -> bool:
    return role in MANAGING_ROLES


@dataclass(frozen=True)
class SignInPolicy:
    max_failures_per_name: int = 5
    max_failures_per_client: int = 20
    window_s: float = 300.0
    session_ttl_s: float = 12 * 3600.0

    def __post_init__(self) -> None:
        if self.max_failures_per_name < 1 or self.max_failures_per_client < 1:
            raise ValueError(
                f"failure limits must be at least 1, got {self.max_failures_per_name} per name and "
                f"{self.max_failures_per_client} per client"
            )
        if self.window_s <= 0 or self.session_ttl_s <= 0:
            raise ValueError(
                f"window and session lifetime must be positive, got {self.window_s} s and "
                f"{self.session_ttl_s} s"
            )


def lockout_remaining(failure_times: Iterable[float], now: float, limit: int, window_s: float) -> float:
    """Seconds until one more attempt is allowed (0.0: allowed now), given the times of wrong passwords."""
    recent = sorted(t for t in failure_times if now - window_s < t <= now)
    if len(recent) < limit:
        return 0.0
    # the attempt is allowed once all but limit-1 of the recent failures have left the window
    return recent[len(recent) - limit] + window_s - now
