"""Browser test (issue 13 item 7): an individual account signs in in Debian's Chromium and stays signed in
across a page reload; an admin manages accounts on the Accounts page; sign-out survives a reload too.

Accounts are made with the real CLI (`python -m dashboard accounts add`, password on standard input)
against a filled database, then `streamlit run app.py` serves it. Screenshots: accounts-*.png.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.browser.pw import (
    FRESH_FILL,
    browser_page,
    open_page,
    require_chromium,
    screenshot,
    streamlit_app,
    wait_idle,
)
from tests.dashboard.fill import filled_engine
from tests.support import PYTHON, REPO

pytestmark = pytest.mark.browser

PASSWORD = "a browser-test password"
COOKIE = "prefixops_session"


def _cli(database_url: str, *args: str, stdin: str = "") -> str:
    done = subprocess.run(
        [PYTHON, "-m", "dashboard", "--database-url", database_url, "accounts", *args],
        input=stdin,
        text=True,
        capture_output=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    require_chromium()
    path: Path = tmp_path_factory.mktemp("accounts") / "filled.db"
    engine, _now = filled_engine(f"sqlite:///{path}")
    engine.dispose()
    url = f"sqlite:///{path}"
    assert _cli(url, "add", "ada", "--role", "admin", stdin=PASSWORD + "\n") == "added ada (admin)\n"
    assert _cli(url, "add", "vera", "--role", "viewer", stdin=PASSWORD + "\n") == "added vera (viewer)\n"
    with streamlit_app(url, FRESH_FILL) as base:
        yield base, url


def _sign_in(page: Any, name: str, password: str) -> None:
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_label("Account", exact=True).fill(name)
    sidebar.get_by_label("Password", exact=True).fill(password)
    sidebar.get_by_role("button", name="Sign in", exact=True).click()
    wait_idle(page)


def _signed_in_as(page: Any, role: str | None = None) -> str:
    """The sidebar's "Signed in as" line; with ``role``, once it shows that role (a rerun redraws it)."""
    line = page.get_by_test_id("stSidebar").get_by_text("Signed in as").first
    line.wait_for(timeout=30_000)
    if role is not None:
        page.get_by_test_id("stSidebar").get_by_text(f"({role})").first.wait_for(timeout=30_000)
    return line.inner_text()


def _nav_labels(page: Any) -> list[str]:
    return [a.inner_text().strip() for a in page.locator("[data-testid='stSidebarNav'] a").all()]


def test_an_account_signs_in_and_stays_signed_in_across_a_reload(dashboard: tuple[str, str]) -> None:
    base, database_url = dashboard
    with browser_page(height=1400) as page:
        open_page(page, base + "/")
        page.get_by_label("Password", exact=True).wait_for()
        assert "Accounts" not in _nav_labels(page)
        _sign_in(page, "ada", "not the password")
        page.get_by_text("Wrong account name or password.").wait_for(timeout=30_000)
        screenshot(page, "accounts-sign-in-refused")

        _sign_in(page, "ada", PASSWORD)
        assert "ada" in _signed_in_as(page) and "(admin)" in _signed_in_as(page)
        page.wait_for_function(f"document.cookie.includes('{COOKIE}=')", timeout=30_000)
        cookie = next(c for c in page.context.cookies() if c["name"] == COOKIE)
        assert "ada" not in cookie["value"] and len(cookie["value"]) >= 40 and cookie["sameSite"] == "Strict"

        page.reload()
        wait_idle(page)
        assert "ada" in _signed_in_as(page)  # a new Streamlit session, signed in from the cookie
        assert page.get_by_label("Password", exact=True).count() == 0
        screenshot(page, "accounts-after-reload")

        open_page(page, base + "/accounts")  # a deep link loads the page afresh: still signed in, admin page
        page.get_by_role("heading", name="Accounts", exact=True).first.wait_for(timeout=30_000)
        assert "Accounts" in _nav_labels(page)
        main = page.get_by_test_id("stMain")
        main.get_by_label("Account name", exact=True).fill("oscar")
        main.get_by_label("Password (at least 12 characters)", exact=True).fill(PASSWORD)
        main.get_by_label("Password again", exact=True).fill(PASSWORD)
        main.get_by_role("button", name="Add account", exact=True).click()
        page.get_by_text("Added oscar (operator).").wait_for(timeout=30_000)
        wait_idle(page)
        screenshot(page, "accounts-admin-page")
        assert "oscar" in _cli(database_url, "list")

        page.get_by_test_id("stSidebar").get_by_role("button", name="Sign out", exact=True).click()
        page.get_by_label("Password", exact=True).wait_for(timeout=30_000)
        page.reload()
        wait_idle(page)
        assert page.get_by_label("Password", exact=True).count() == 1  # signed out stays signed out
        assert page.get_by_text("Signed in as").count() == 0

    from db import make_engine
    from db.models import SecurityEvent

    with make_engine(database_url).connect() as conn:
        rows = conn.execute(
            select(SecurityEvent.event, SecurityEvent.account, SecurityEvent.outcome, SecurityEvent.client)
            .where(SecurityEvent.method != "cli")
            .order_by(SecurityEvent.id)
        ).all()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("sign-in", "ada", "wrong password"),
        ("sign-in", "ada", "ok"),
        ("account.add", "oscar", "ok"),
        ("sign-out", "ada", "ok"),
    ]
    assert all(r[3] is None for r in rows)  # Streamlit reports no address for a loopback client


def test_a_viewer_account_reads_but_has_no_controls_and_no_accounts_page(dashboard: tuple[str, str]) -> None:
    base, _url = dashboard
    with browser_page(height=1400) as page:
        open_page(page, base + "/sessions?engine=a")
        _sign_in(page, "vera", PASSWORD)
        assert "(viewer)" in _signed_in_as(page, "viewer")
        page.reload()
        wait_idle(page)
        assert "(viewer)" in _signed_in_as(page, "viewer")
        assert "Accounts" not in _nav_labels(page)
        assert page.get_by_text("viewer role: view only").count() >= 1
        screenshot(page, "accounts-viewer")
