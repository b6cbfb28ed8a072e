"""db.accounts on SQLite and PostgreSQL: the 0004 migration over a database with data, accounts,
sign-in sessions, the throttle and the security log."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from collectors.store import Store
from core.accounts import AccountError, SignInPolicy
from db import accounts, make_engine
from db.migrate import current_revision, head_revision, upgrade
from db.models import Account, AccountSession, Alert, AuditEntry, Sample, SecurityEvent
from tests.db.test_storage import T0, config, engine_outcome

PASSWORD = "correct horse battery staple"


@pytest.fixture
def engine(db_url):
    e = make_engine(db_url)
    upgrade(e)
    yield e
    e.dispose()


def test_upgrade_from_0003_with_data_keeps_it_and_adds_the_accounts_tables(db_url):
    engine = make_engine(db_url)
    upgrade(engine, "0003_epochs")
    old = Store(engine, clock=lambda: T0)
    old.sync_targets(config())
    old.write([engine_outcome(T0 + i, 0.5) for i in range(60)])
    with engine.begin() as conn:
        conn.execute(
            AuditEntry.__table__.insert().values(
                source="dashboard", ts=T0, actor="alice", action="sign-in", params={}, outcome="ok", data={}
            )
        )
        conn.execute(
            Alert.__table__.insert().values(
                rule="collapse",
                target_id=None,
                engine_label="",
                severity="critical",
                state="firing",
                started_ts=T0,
                summary="s",
                values={},
                silenced=False,
            )
        )
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Sample)).scalar() == 60 * 3
        assert conn.execute(select(AuditEntry.actor)).scalars().all() == ["alice"]
        assert conn.execute(select(Alert.rule)).scalars().all() == ["collapse"]
    accounts.add_account(engine, "ada", "admin", PASSWORD, actor="test", method="cli", now=T0)
    assert [a["name"] for a in accounts.list_accounts(engine)] == ["ada"]
    assert accounts.sign_in(engine, "ada", PASSWORD, now=T0 + 1).identity == accounts.Identity("ada", "admin")
    engine.dispose()


def test_passwords_are_stored_only_as_argon2id_hashes(engine):
    accounts.add_account(engine, "Alice", "operator", PASSWORD, actor="test", method="cli", now=T0)
    with engine.connect() as conn:
        row = conn.execute(select(Account)).one()
    assert row.name == "alice" and row.role == "operator"
    assert (
        row.password_hash.startswith("$argon2id$v=19$m=65536,t=3,p=4$") and PASSWORD not in row.password_hash
    )
    with pytest.raises(AccountError, match="already exists"):
        accounts.add_account(engine, "ALICE", "viewer", PASSWORD, actor="test", method="cli")
    with pytest.raises(AccountError, match="password too short"):
        accounts.add_account(engine, "bob", "viewer", "short", actor="test", method="cli")


def test_session_lives_until_sign_out_expiry_or_removal(engine):
    accounts.add_account(engine, "alice", "operator", PASSWORD, actor="test", method="cli", now=T0)
    accounts.add_account(engine, "ada", "admin", PASSWORD, actor="test", method="cli", now=T0)
    policy = SignInPolicy(session_ttl_s=100.0)
    first = accounts.sign_in(engine, "alice", PASSWORD, client="10.0.0.1", now=T0, policy=policy)
    assert first.token and accounts.session_identity(engine, first.token, T0 + 99) == accounts.Identity(
        "alice", "operator"
    )
    assert accounts.session_identity(engine, first.token, T0 + 100) is None  # expired
    assert accounts.session_identity(engine, "not-a-token", T0) is None
    with engine.connect() as conn:  # only the token's digest is stored
        assert conn.execute(select(AccountSession.token_hash)).scalar_one() == accounts.token_digest(
            first.token
        )
    second = accounts.sign_in(engine, "alice", PASSWORD, now=T0 + 10, policy=policy)
    accounts.set_role(engine, "alice", "viewer", actor="ada", method="dashboard", now=T0 + 11)
    assert accounts.session_identity(engine, second.token, T0 + 12).role == "viewer"  # applies at once
    assert accounts.sign_out(engine, second.token, now=T0 + 13) == accounts.Identity("alice", "viewer")
    assert accounts.session_identity(engine, second.token, T0 + 14) is None
    third = accounts.sign_in(engine, "alice", PASSWORD, now=T0 + 20, policy=policy)
    accounts.remove_account(engine, "alice", actor="ada", method="dashboard", now=T0 + 21)
    assert accounts.session_identity(engine, third.token, T0 + 22) is None
    events = [
        (e["event"], e["account"], e["outcome"]) for e in reversed(accounts.security_events(engine, since=0))
    ]
    assert events == [
        ("account.add", "alice", "ok"),
        ("account.add", "ada", "ok"),
        ("sign-in", "alice", "ok"),
        ("sign-in", "alice", "ok"),
        ("account.role", "alice", "ok"),
        ("sign-out", "alice", "ok"),
        ("sign-in", "alice", "ok"),
        ("account.remove", "alice", "ok"),
    ]


def test_the_last_admin_can_be_neither_removed_nor_demoted(engine):
    accounts.add_account(engine, "ada", "admin", PASSWORD, actor="test", method="cli", now=T0)
    with pytest.raises(AccountError, match="'ada' is the last admin"):
        accounts.remove_account(engine, "ada", actor="test", method="cli")
    with pytest.raises(AccountError, match="'ada' is the last admin"):
        accounts.set_role(engine, "ada", "operator", actor="test", method="cli")
    with pytest.raises(AccountError, match="no account named 'nobody'"):
        accounts.remove_account(engine, "nobody", actor="test", method="cli")
    accounts.add_account(engine, "root2", "admin", PASSWORD, actor="test", method="cli", now=T0)
    accounts.remove_account(engine, "ada", actor="root2", method="cli")
    assert [a["name"] for a in accounts.list_accounts(engine)] == ["root2"]


def test_failed_sign_ins_lock_the_name_then_the_client(engine):
    accounts.add_account(engine, "alice", "operator", PASSWORD, actor="test", method="cli", now=T0)
    policy = SignInPolicy(max_failures_per_name=3, max_failures_per_client=5, window_s=60.0)
    for i in range(3):
        assert (
            accounts.sign_in(
                engine, "alice", "wrong password!", client="c1", now=T0 + i, policy=policy
            ).message
            == "Wrong account name or password."
        )
    locked = accounts.sign_in(engine, "alice", PASSWORD, client="c2", now=T0 + 3, policy=policy)
    assert locked.identity is None and locked.message == "Too many failed sign-ins; try again in 57 s."
    # one client guessing many names is stopped too: c1 now has 5 failures in the window
    for i, name in enumerate(["u1", "u2"]):
        accounts.sign_in(engine, name, "wrong password!", client="c1", now=T0 + 3 + i, policy=policy)
    assert accounts.lockout(engine, "someone-else", "c1", T0 + 5, policy) == 55.0
    assert accounts.lockout(engine, "someone-else", "c2", T0 + 5, policy) == 0.0
    assert accounts.sign_in(engine, "alice", PASSWORD, client="c2", now=T0 + 60, policy=policy).identity
    with engine.connect() as conn:
        outcomes = (
            conn.execute(
                select(SecurityEvent.outcome)
                .where(SecurityEvent.event == "sign-in")
                .order_by(SecurityEvent.id)
            )
            .scalars()
            .all()
        )
    assert outcomes == ["wrong password"] * 3 + ["locked", "unknown account", "unknown account", "ok"]
