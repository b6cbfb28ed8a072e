"""Operator accounts, sign-in sessions and the security log (tables ``accounts``, ``account_sessions``,
``security_log``): what `python -m dashboard accounts ...` and the dashboard's sign-in use.

Passwords are stored only as Argon2id hashes (argon2-cffi's `PasswordHasher` with its defaults, the
RFC 9106 "low memory" profile: 3 passes over 64 MiB, 4 lanes, 16-byte random salt, 32-byte tag), in
the PHC string format, so the parameters travel with each hash and a hash made with older ones is
re-made at the next successful sign-in. Names, roles, password rules and the sign-in throttle are in
`core.accounts`.

A sign-in creates a session: a random 256-bit token (`secrets.token_urlsafe(32)`) that the browser
keeps in a cookie; only its SHA-256 is stored, with the account and an expiry. Every script run looks
the token up (`session_identity`), so signing out, removing the account or the expiry ends it at once
on every page; a changed role applies on the next run.

Every sign-in (either outcome), sign-out and account change is a row in ``security_log``, never in
the action audit. Errors a person can meet are `core.accounts.AccountError` with the reason.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import Engine, delete, func, insert, select, update

from core.accounts import (
    AccountError,
    SignInPolicy,
    can_manage_accounts,
    check_password,
    check_role,
    lockout_remaining,
    normalize_name,
)
from db.models import Account, AccountSession, SecurityEvent

logger = logging.getLogger(__name__)

FAILED_OUTCOMES = ("wrong password", "unknown account")
DEFAULT_POLICY = SignInPolicy()


@dataclass(frozen=True)
class Identity:
    """Who a signed-in session belongs to."""

    name: str
    role: str


@dataclass(frozen=True)
class SignInResult:
    identity: Identity | None
    token: str | None
    message: str


@lru_cache(maxsize=1)
def _hasher() -> PasswordHasher:
    return PasswordHasher()


@lru_cache(maxsize=1)
def _dummy_hash() -> str:
    """Verified against when the name is unknown, so a wrong name costs as long as a wrong password."""
    return _hasher().hash(secrets.token_urlsafe(16))


def hash_password(password: str) -> str:
    return _hasher().hash(check_password(password))


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def log_event(
    engine: Engine,
    *,
    event: str,
    account: str | None,
    outcome: str,
    method: str | None = None,
    client: str | None = None,
    actor: str | None = None,
    detail: dict[str, Any] | None = None,
    now: float | None = None,
) -> None:
    with engine.begin() as conn:
        _record(conn, event, account, outcome, method, client, actor, detail, now)


def _record(
    conn: Any,
    event: str,
    account: str | None,
    outcome: str,
    method: str | None,
    client: str | None,
    actor: str | None,
    detail: dict[str, Any] | None,
    now: float | None,
) -> None:
    conn.execute(
        insert(SecurityEvent).values(
            ts=time.time() if now is None else now,
            event=event,
            account=(account or "")[:200] or None,
            outcome=outcome[:200],
            method=method,
            client=(client or "")[:200] or None,
            actor=actor,
            detail=detail or {},
        )
    )


@contextmanager
def _account_change(
    engine: Engine,
    event: str,
    name: str,
    *,
    actor: str | None,
    method: str,
    client: str | None,
    now: float | None,
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """One transaction for an account change and its ``ok`` row in the security log.

    Yields the connection and the row's detail (the body fills it in); an AccountError raised by the
    body rolls the change back and logs nothing, so the log never claims a change that did not happen.
    """
    with engine.begin() as conn:
        detail: dict[str, Any] = {}
        yield conn, detail
        _record(conn, event, name, "ok", method, client, actor, detail, now)


def security_events(engine: Engine, *, since: float, limit: int = 1000) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(SecurityEvent)
            .where(SecurityEvent.ts >= since)
            .order_by(SecurityEvent.ts.desc(), SecurityEvent.id.desc())
            .limit(limit)
        ).all()
        return [
            {
                "ts": r.ts,
                "event": r.event,
                "account": r.account,
                "outcome": r.outcome,
                "method": r.method,
                "client": r.client,
                "actor": r.actor,
            }
            for r in rows
        ]


# ------------------------------------------------------------------------------------- accounts
def list_accounts(engine: Engine, now: float | None = None) -> list[dict[str, Any]]:
    now = time.time() if now is None else now
    live = (
        select(AccountSession.account_id, func.count().label("n"))
        .where(AccountSession.expires_ts > now)
        .group_by(AccountSession.account_id)
        .subquery()
    )
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                Account.name,
                Account.role,
                Account.created_ts,
                Account.created_by,
                Account.last_sign_in_ts,
                func.coalesce(live.c.n, 0),
            )
            .outerjoin(live, live.c.account_id == Account.id)
            .order_by(Account.name)
        ).all()
    return [
        {
            "name": r[0],
            "role": r[1],
            "created_ts": r[2],
            "created_by": r[3],
            "last_sign_in_ts": r[4],
            "sessions": int(r[5]),
        }
        for r in rows
    ]


def add_account(
    engine: Engine,
    name: str,
    role: str,
    password: str,
    *,
    actor: str | None,
    method: str,
    client: str | None = None,
    now: float | None = None,
) -> Identity:
    """Create an account; AccountError when the name, role or password is unusable or the name is taken."""
    now = time.time() if now is None else now
    name, role = normalize_name(name), check_role(role)
    hashed = hash_password(password)
    change = _account_change(engine, "account.add", name, actor=actor, method=method, client=client, now=now)
    with change as (conn, detail):
        if conn.execute(select(Account.id).where(Account.name == name)).first() is not None:
            raise AccountError(f"account {name!r} already exists (remove it first, or change its role)")
        conn.execute(
            insert(Account).values(
                name=name,
                role=role,
                password_hash=hashed,
                created_ts=now,
                created_by=actor,
                password_changed_ts=now,
                last_sign_in_ts=None,
            )
        )
        detail["role"] = role
    return Identity(name, role)


def _admins_left_without(conn: Any, name: str) -> int:
    return int(
        conn.execute(
            select(func.count()).select_from(Account).where(Account.role == "admin", Account.name != name)
        ).scalar_one()
    )


def _existing(conn: Any, name: str) -> Any:
    row = conn.execute(select(Account).where(Account.name == name)).first()
    if row is None:
        raise AccountError(f"no account named {name!r}")
    return row


def remove_account(
    engine: Engine,
    name: str,
    *,
    actor: str | None,
    method: str,
    client: str | None = None,
    now: float | None = None,
) -> None:
    """Delete an account and end its sessions; refuses to remove the last admin."""
    name = normalize_name(name)
    change = _account_change(
        engine, "account.remove", name, actor=actor, method=method, client=client, now=now
    )
    with change as (conn, _detail):
        account = _existing(conn, name)
        if account.role == "admin" and _admins_left_without(conn, name) == 0:
            raise AccountError(f"{name!r} is the last admin: add another admin before removing it")
        conn.execute(delete(AccountSession).where(AccountSession.account_id == account.id))
        conn.execute(delete(Account).where(Account.id == account.id))


def set_role(
    engine: Engine,
    name: str,
    role: str,
    *,
    actor: str | None,
    method: str,
    client: str | None = None,
    now: float | None = None,
) -> None:
    name, role = normalize_name(name), check_role(role)
    change = _account_change(engine, "account.role", name, actor=actor, method=method, client=client, now=now)
    with change as (conn, detail):
        account = _existing(conn, name)
        if account.role == "admin" and role != "admin" and _admins_left_without(conn, name) == 0:
            raise AccountError(f"{name!r} is the last admin: add another admin before changing its role")
        conn.execute(update(Account).where(Account.id == account.id).values(role=role))
        detail.update({"from": account.role, "to": role})


def set_password(
    engine: Engine,
    name: str,
    password: str,
    *,
    actor: str | None,
    method: str,
    client: str | None = None,
    now: float | None = None,
) -> None:
    """Replace an account's password and end its sessions (everyone signs in again with the new one)."""
    now = time.time() if now is None else now
    name, hashed = normalize_name(name), hash_password(password)
    change = _account_change(
        engine, "account.password", name, actor=actor, method=method, client=client, now=now
    )
    with change as (conn, _detail):
        account = _existing(conn, name)
        conn.execute(
            update(Account)
            .where(Account.id == account.id)
            .values(password_hash=hashed, password_changed_ts=now)
        )
        conn.execute(delete(AccountSession).where(AccountSession.account_id == account.id))


# -------------------------------------------------------------------------------------- sign-in
def _failures(conn: Any, column: Any, value: str, since: float) -> list[float]:
    return list(
        conn.execute(
            select(SecurityEvent.ts).where(
                SecurityEvent.event == "sign-in",
                SecurityEvent.outcome.in_(FAILED_OUTCOMES),
                column == value,
                SecurityEvent.ts > since,
            )
        ).scalars()
    )


def lockout(
    engine: Engine, name: str, client: str | None, now: float, policy: SignInPolicy = DEFAULT_POLICY
) -> float:
    """Seconds before `name` (or anyone from `client`) may try again; 0.0 when allowed now."""
    since = now - policy.window_s
    with engine.connect() as conn:
        wait = lockout_remaining(
            _failures(conn, SecurityEvent.account, name, since),
            now,
            policy.max_failures_per_name,
            policy.window_s,
        )
        if client:
            wait = max(
                wait,
                lockout_remaining(
                    _failures(conn, SecurityEvent.client, client, since),
                    now,
                    policy.max_failures_per_client,
                    policy.window_s,
                ),
            )
    return wait


def sign_in(
    engine: Engine,
    name: str,
    password: str,
    *,
    client: str | None = None,
    now: float | None = None,
    policy: SignInPolicy = DEFAULT_POLICY,
) -> SignInResult:
    """Check a name and password; on success create a session. Every attempt goes to the security log."""
    now = time.time() if now is None else now
    typed = name.strip().lower()[:64]
    try:
        key = normalize_name(name)
    except AccountError:
        key = typed

    def attempt(outcome: str) -> None:
        log_event(
            engine, event="sign-in", account=key, outcome=outcome, method="password", client=client, now=now
        )

    wait = lockout(engine, key, client, now, policy)
    if wait > 0:
        attempt("locked")
        return SignInResult(None, None, f"Too many failed sign-ins; try again in {wait:.0f} s.")
    with engine.connect() as conn:
        account = conn.execute(select(Account).where(Account.name == key)).first()
    stored = account.password_hash if account is not None else _dummy_hash()
    try:
        ok = _hasher().verify(stored, password) and account is not None
    except (VerificationError, InvalidHashError):
        ok = False
    if not ok or account is None:
        outcome = "wrong password" if account is not None else "unknown account"
        attempt(outcome)
        logger.warning("sign-in failed for %r: %s", key, outcome)
        return SignInResult(None, None, "Wrong account name or password.")
    token = secrets.token_urlsafe(32)
    rehash = _hasher().check_needs_rehash(account.password_hash)
    with engine.begin() as conn:
        conn.execute(delete(AccountSession).where(AccountSession.expires_ts <= now))
        conn.execute(
            insert(AccountSession).values(
                token_hash=token_digest(token),
                account_id=account.id,
                created_ts=now,
                expires_ts=now + policy.session_ttl_s,
                client=(client or "")[:200] or None,
            )
        )
        values: dict[str, Any] = {"last_sign_in_ts": now}
        if rehash:
            values["password_hash"] = _hasher().hash(password)
        conn.execute(update(Account).where(Account.id == account.id).values(**values))
    attempt("ok")
    logger.info("sign-in: %r (%s)", key, account.role)
    return SignInResult(Identity(account.name, account.role), token, f"Signed in as {account.name}.")


def session_identity(engine: Engine, token: str, now: float | None = None) -> Identity | None:
    """The account a session token belongs to, or None when it is unknown, expired or its account is gone."""
    now = time.time() if now is None else now
    with engine.connect() as conn:
        row = conn.execute(
            select(Account.name, Account.role)
            .join(AccountSession, AccountSession.account_id == Account.id)
            .where(AccountSession.token_hash == token_digest(token), AccountSession.expires_ts > now)
        ).first()
    return Identity(row[0], row[1]) if row is not None else None


def sign_out(
    engine: Engine, token: str, *, client: str | None = None, now: float | None = None
) -> Identity | None:
    identity = session_identity(engine, token, now)
    with engine.begin() as conn:
        conn.execute(delete(AccountSession).where(AccountSession.token_hash == token_digest(token)))
    if identity is not None:
        log_event(
            engine,
            event="sign-out",
            account=identity.name,
            outcome="ok",
            method="password",
            client=client,
            now=now,
        )
    return identity


def may_manage(identity: Identity | None) -> bool:
    return identity is not None and can_manage_accounts(identity.role)
