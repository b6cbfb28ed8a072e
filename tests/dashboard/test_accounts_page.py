"""AppTests of the Accounts page: admins only; add, change role, remove; every change in the security log."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from db import accounts, make_engine
from db.models import SecurityEvent
from tests.dashboard.apptest import app, sign_in, texts
from tests.dashboard.conftest import PASSPHRASE


def _names(db_url: str) -> dict[str, str]:
    return {a["name"]: a["role"] for a in accounts.list_accounts(make_engine(db_url))}


def test_an_admin_adds_changes_and_removes_accounts(db_url: str) -> None:
    at = sign_in(app(), name="ada")
    assert "(admin)" in texts(at)
    at.switch_page("pages/accounts.py").run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Accounts"
    assert set(at.dataframe[0].value["account"]) == {"ada", "alice", "vera"}

    at.text_input(key="account_new_name").input("Oscar")
    at.selectbox(key="account_new_role").set_value("operator")
    at.text_input(key="account_new_password").input("short")
    at.text_input(key="account_new_password2").input("short")
    next(b for b in at.button if b.label == "Add account").click()
    at.run()
    assert "password too short" in texts(at)
    assert "oscar" not in _names(db_url)

    at.text_input(key="account_new_name").input("Oscar")
    at.text_input(key="account_new_password").input(PASSPHRASE)
    at.text_input(key="account_new_password2").input(PASSPHRASE)
    next(b for b in at.button if b.label == "Add account").click()
    at.run()
    assert "Added oscar" in texts(at)
    assert _names(db_url)["oscar"] == "operator"

    at.selectbox(key="account_chosen").set_value("oscar")
    at.selectbox(key="account_role").set_value("viewer").run()
    at.button(key="account_set_role").click().run()
    assert _names(db_url)["oscar"] == "viewer"
    at.selectbox(key="account_chosen").set_value("oscar").run()
    assert at.button(key="account_remove").disabled  # not without the confirmation box
    at.checkbox(key="account_remove_sure").check().run()
    at.button(key="account_remove").click().run()
    assert "oscar" not in _names(db_url)

    at.selectbox(key="account_chosen").set_value("ada")
    at.selectbox(key="account_role").set_value("viewer").run()
    at.button(key="account_set_role").click().run()
    assert "last admin" in texts(at) and _names(db_url)["ada"] == "admin"

    with make_engine(db_url).connect() as conn:
        rows = conn.execute(
            select(SecurityEvent.event, SecurityEvent.account, SecurityEvent.actor)
            .where(SecurityEvent.method == "dashboard")
            .order_by(SecurityEvent.id)
        ).all()
    assert [tuple(r) for r in rows] == [
        ("account.add", "oscar", "ada"),
        ("account.role", "oscar", "ada"),
        ("account.remove", "oscar", "ada"),
    ]


def test_the_accounts_page_is_listed_for_admins_only(db_url: str) -> None:
    at = sign_in(app(), name="alice")  # an operator
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        at.switch_page("pages/accounts.py")
    at = app()
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        at.switch_page("pages/accounts.py")


def test_a_viewer_can_neither_silence_nor_expire_and_an_operator_silences_as_their_account(
    db_url: str,
) -> None:
    at = sign_in(app(), name="vera")
    at.switch_page("pages/alerts.py").run()
    card_buttons = [b for b in at.button if b.key and b.key.startswith(("silence_", "ack_", "expire_"))]
    assert card_buttons and all(b.disabled for b in card_buttons)
    at = sign_in(app(), name="alice")
    at.switch_page("pages/alerts.py").run()
    silence = next(b for b in at.button if b.key and b.key.startswith("silence_") and b.key != "silence_add")
    silence.click().run()
    at.button(key="confirm_action").click().run()
    from db.models import AuditEntry, Silence

    with make_engine(db_url).connect() as conn:
        made = conn.execute(select(Silence.created_by).order_by(Silence.id.desc())).scalars().first()
        audit = conn.execute(
            select(AuditEntry.actor, AuditEntry.action).order_by(AuditEntry.id.desc())
        ).first()
    assert made == "alice" and tuple(audit) == ("alice", "alert.silence")
