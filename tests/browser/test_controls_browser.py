"""Browser test (issue 6): the real processes, an operator in Debian's Chromium.

simulator -> sidecar -> collectors -> SQLite -> `streamlit run app.py`, all on
free loopback ports. Signed out, no control can be used; signed in, the
operator parks a session (and the sidecar has it parked), changes the bands
(and /state and the Audit page show it), and defers compaction (and the gate
defers a compaction request). Every page is screenshotted (live-*.png).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from tests.browser.pw import browser_page, open_page, require_chromium, screenshot, streamlit_app, wait_idle
from tests.support import PYTHON, REPO, running, simulator_and_sidecar, wait_for

pytestmark = pytest.mark.browser

TOKEN = "browser-operator-token"
PASSPHRASE = "browser passphrase"  # alice's password (an operator account made with the CLI)
SESSIONS = ("agent-1", "agent-2", "agent-3")
PAGES = ["Overview", "Engine", "Sessions", "Budgeter", "Compaction", "Alerts", "Audit"]


@dataclass
class Stack:
    dashboard: str
    sidecar: str
    engine: str
    database_url: str


def _require_processes() -> None:
    missing = [m for m in ("simulator", "sidecar", "collectors") if not (REPO / m / "__main__.py").exists()]
    if missing:
        pytest.fail(f"packages without __main__.py: {missing}")


def _drive_sessions(sidecar: str) -> None:
    with httpx.Client(timeout=30.0) as client:
        model = client.get(f"{sidecar}/v1/models").json()["data"][0]["id"]
        for turn in range(2):
            for sid in SESSIONS:
                body = {
                    "model": model,
                    "max_tokens": 8,
                    "messages": [
                        {"role": "system", "content": "You are a careful agent. " * 40},
                        {"role": "user", "content": f"{sid} turn {turn} " * 30},
                    ],
                }
                response = client.post(
                    f"{sidecar}/v1/chat/completions", json=body, headers={"X-Session-Id": sid}
                )
                assert response.status_code == 200, response.text


def _sessions_in_db(database_url: str) -> set[str]:
    from db import make_engine
    from db.models import Session

    engine = make_engine(database_url, read_only=True)
    try:
        with engine.connect() as conn:
            return set(conn.execute(select(Session.session_id)).scalars())
    finally:
        engine.dispose()


def _collector_config(tmp: Path, engine: str, sidecar: str) -> Path:
    config = tmp / "prefixops.toml"
    config.write_text(
        f'[collector]\ninterval_s = 0.5\n\n[[engines]]\nurl = "{engine}"\nname = "sim"\n\n'
        f'[[sidecars]]\nurl = "{sidecar}"\nengine = "{engine}"\nname = "sim-sidecar"\n'
        f'operator_token = "{TOKEN}"\n'
    )
    return config


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_chromium()
    _require_processes()
    tmp: Path = tmp_path_factory.mktemp("live")
    database_url = f"sqlite:///{tmp / 'prefixops.db'}"
    with (
        simulator_and_sidecar(
            tmp, engine_args=("--speed", "20"), sidecar_env={"PREFIXOPS_OPERATOR_TOKEN": TOKEN}
        ) as (engine, sidecar),
        running(
            [PYTHON, "-m", "collectors", "--config", str(_collector_config(tmp, engine, sidecar))]
            + ["--database-url", database_url],
            name="collectors",
        ),
    ):
        _drive_sessions(sidecar)
        wait_for(
            lambda: set(SESSIONS) <= _sessions_in_db(database_url),
            60,
            "the collectors to record the sessions",
            interval=0.25,
            tolerate=(Exception,),
        )  # the database may not exist yet
        subprocess.run(
            [
                PYTHON,
                "-m",
                "dashboard",
                "--database-url",
                database_url,
                "accounts",
                "add",
                "alice",
                "--role",
                "operator",
            ],
            input=PASSPHRASE + "\n",
            text=True,
            check=True,
            timeout=60,
            cwd=REPO,
        )
        env = {"PREFIXOPS_CONFIG": str(tmp / "prefixops.toml"), "PREFIXOPS_REFRESH_SECONDS": "1"}
        with streamlit_app(database_url, env) as dashboard:
            yield Stack(dashboard, sidecar, engine, database_url)


def _sign_in(page: Any, base: str) -> None:
    open_page(page, base + "/")
    page.get_by_label("Account", exact=True).fill("alice")
    page.get_by_label("Password", exact=True).fill(PASSPHRASE)
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.get_by_text("Signed in as").wait_for(timeout=30_000)


def _goto(page: Any, label: str) -> None:
    """Navigate inside the app (a page load would start a new, signed-out Streamlit session)."""
    page.locator("[data-testid='stSidebarNav'] a", has_text=label).first.click()
    page.get_by_role("heading", name=label, exact=True).first.wait_for(timeout=30_000)
    wait_idle(page)


def _confirm(page: Any) -> None:
    dialog = page.get_by_role("dialog")
    dialog.wait_for(timeout=30_000)
    dialog.get_by_role("button", name="Confirm", exact=True).click()
    dialog.wait_for(state="detached", timeout=30_000)
    wait_idle(page)


def _number(page: Any, label: str, value: str) -> None:
    box = page.get_by_label(label)
    box.fill(value)
    box.press("Enter")
    wait_idle(page)


def test_signed_out_no_control_can_be_used(stack: Stack) -> None:
    with browser_page() as page:
        open_page(page, f"{stack.dashboard}/sessions?engine=sim")
        page.get_by_text("agent-1").first.wait_for(state="attached", timeout=30_000)  # a canvas grid cell
        assert page.get_by_role("button", name="Park selected", exact=True).is_disabled()
        assert page.get_by_role("button", name="Unpark selected", exact=True).is_disabled()
        assert page.get_by_text("Sign in as an operator").first.is_visible()
        open_page(page, f"{stack.dashboard}/budgeter?engine=sim")
        assert page.get_by_role("button", name="Apply", exact=True).is_disabled()
        open_page(page, f"{stack.dashboard}/compaction?engine=sim")
        assert page.get_by_role("button", name="Defer compaction", exact=True).is_disabled()
        assert page.get_by_role("button", name="Lift deferral", exact=True).is_disabled()
    state = httpx.get(f"{stack.sidecar}/state").json()
    assert state["compaction"]["deferred_until"] is None
    assert all(
        s["state"] != "parked" for s in httpx.get(f"{stack.sidecar}/sessions").json() if isinstance(s, dict)
    )


def test_operator_parks_a_session_and_the_sidecar_has_it_parked(stack: Stack) -> None:
    with browser_page() as page:
        _sign_in(page, stack.dashboard)
        _goto(page, "Sessions")
        chooser = page.get_by_label("Sessions to act on (from the filtered list)")
        chooser.click()
        chooser.fill("agent-2")
        chooser.press("Enter")
        page.keyboard.press("Escape")
        wait_idle(page)
        page.get_by_role("button", name="Park selected", exact=True).click()
        page.get_by_role("dialog").get_by_text("Park 1 session(s) on engine sim").wait_for(timeout=30_000)
        _confirm(page)
        page.get_by_text("parked 1 of 1 session(s) on engine sim").wait_for(timeout=30_000)
        screenshot(page, "live-sessions-after-park")
    doc = httpx.get(f"{stack.sidecar}/sessions/agent-2").json()
    assert doc["state"] == "parked" and doc["manual"] is True


def test_operator_changes_bands_seen_in_state_and_on_audit(stack: Stack) -> None:
    with browser_page() as page:
        _sign_in(page, stack.dashboard)
        _goto(page, "Budgeter")
        _number(page, "Low band (fraction of pool)", "0.60")
        _number(page, "High band (fraction of pool)", "0.90")
        page.get_by_text("Preview").first.wait_for(timeout=30_000)
        page.get_by_role("button", name="Apply", exact=True).click()
        _confirm(page)
        page.get_by_text("budgeter on engine sim: done").wait_for(timeout=30_000)
        budgeter = httpx.get(f"{stack.sidecar}/state").json()["budgeter"]
        assert (budgeter["low"], budgeter["high"]) == (pytest.approx(0.6), pytest.approx(0.9))

        def audit_shows_it() -> bool:
            _goto(page, "Audit")
            page.wait_for_timeout(1000)
            return page.get_by_text("budgeter.update").count() > 0 and page.get_by_text("alice").count() > 0

        wait_for(
            audit_shows_it, 60, "the band change on the Audit page", interval=0.25, tolerate=(Exception,)
        )
        screenshot(page, "live-audit-after-bands")


def test_operator_defers_compaction_and_the_gate_defers(stack: Stack) -> None:
    with browser_page() as page:
        _sign_in(page, stack.dashboard)
        _goto(page, "Compaction")
        page.get_by_label("Reason (recorded in the audit)").fill("browser test")
        page.get_by_role("button", name="Defer compaction", exact=True).click()
        _confirm(page)
        page.get_by_text("defer on engine sim: done").wait_for(timeout=30_000)
    compaction = httpx.get(f"{stack.sidecar}/state").json()["compaction"]
    assert compaction["deferred_until"] > time.time() + 50 * 60
    assert compaction["deferred_by"] == "alice"
    decision = httpx.post(f"{stack.sidecar}/compaction/requests", json={"subtrees": ["cold-subtree"]}).json()
    assert decision["deferred"] == ["cold-subtree"], decision


def test_screenshot_every_page_of_the_live_stack(stack: Stack) -> None:
    with browser_page() as page:
        _sign_in(page, stack.dashboard)
        for label in PAGES:
            _goto(page, label)
            page.wait_for_timeout(1500)
            wait_idle(page)
            assert page.locator("[data-testid='stException']").count() == 0, label
            screenshot(page, f"live-{label.lower()}")
