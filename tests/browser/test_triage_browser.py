"""Browser tests of issue 13's on-call path, in Debian's Chromium over a real `streamlit run app.py`:
a frozen engine behind a live sidecar, the sidecar's queue on the Overview, an alert's link landing on
the page where its fix is applied, the "at that moment" view, and the Overview of a 200-engine fleet.
Screenshots go to artifacts/screenshots/triage-*.png."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import insert, select, update

from db import make_engine
from db.models import Alert, SidecarState, Target
from tests.browser.pw import FRESH_FILL, browser_page, require_chromium, screenshot, streamlit_app
from tests.dashboard.fill import filled_engine
from tests.dashboard.fill_fleet import fill_fleet

pytestmark = pytest.mark.browser


def serve(path: Path) -> Iterator[str]:
    with streamlit_app(f"sqlite:///{path}", {**FRESH_FILL, "PREFIXOPS_REFRESH_SECONDS": "5"}) as base:
        yield base


@pytest.fixture(scope="module")
def triage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The filled fleet, with c's engine frozen behind a live sidecar and b's sessions queueing."""
    require_chromium()
    path = tmp_path_factory.mktemp("triage") / "triage.db"
    engine, now = filled_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(
            update(Target)
            .where(Target.name == "c-sidecar")
            .values(up=True, last_success_ts=now - 1, last_error=None, consecutive_failures=0)
        )
        conn.execute(update(Target).where(Target.name == "c").values(last_error="ReadTimeout: engine hung"))
        b_side = conn.execute(select(Target.id).where(Target.name == "b-sidecar")).scalar_one()
        row = conn.execute(select(SidecarState.state).where(SidecarState.target_id == b_side)).scalar_one()
        conn.execute(
            update(SidecarState)
            .where(SidecarState.target_id == b_side)
            .values(
                state=dict(
                    row,
                    backlog={
                        "admitted": 5,
                        "parked": 0,
                        "waiting": 13,
                        "oldest_waiting_s": 84.0,
                        "oldest_parked_s": None,
                    },
                )
            )
        )
        conn.execute(
            insert(Alert).values(
                rule="admission-wait",
                target_id=b_side,
                engine_label="",
                severity="warning",
                state="firing",
                started_ts=now - 30,
                last_eval_ts=now,
                summary="queue",
                values={"oldest_waiting_s": 84.0},
            )
        )
    engine.dispose()
    yield from serve(path)


def text_of(page) -> str:  # noqa: ANN001
    return page.locator("[data-testid='stMain']").inner_text()


def test_frozen_engine_and_the_sidecar_queue_on_the_overview(triage: str) -> None:
    with browser_page() as page:
        page.goto(triage + "/overview")
        page.get_by_text("Needs attention").wait_for(timeout=60_000)
        page.get_by_text("engine c not answering: ReadTimeout").first.wait_for(timeout=30_000)
        body = text_of(page)
        assert "Page not found" not in page.content()
        # the frozen engine: its own last good scrape, not the live sidecar's
        assert re.search(
            r"engine c not answering: ReadTimeout: engine hung \(its last good scrape 1\d min ago\)", body
        )
        # the queue at the sidecar: a state of its own, with the oldest wait
        assert "QUEUEING" in body
        assert "13 sessions waiting at the sidecar, the oldest for 84 s (limit 60 s)" in body
        sidebar = page.locator("[data-testid='stSidebar']").inner_text()
        assert "4/6 targets up" not in sidebar and "5/6 targets up: down c" in sidebar
        page.wait_for_timeout(3000)
        screenshot(page, "triage-overview-frozen-and-queue")


def test_alert_link_lands_on_the_page_of_its_fix(triage: str) -> None:
    with browser_page() as page:
        page.goto(triage + "/alerts")
        page.get_by_text("Fix it on the Budgeter page").first.wait_for(timeout=60_000)
        page.get_by_text("Fix it on the Budgeter page").first.click()
        page.wait_for_url("**/budgeter?*", timeout=30_000)
        assert "engine=a" in page.url
        page.locator("h1", has_text="Budgeter").wait_for(timeout=30_000)
        page.get_by_text("Change mode and bands").wait_for(timeout=30_000)
        screenshot(page, "triage-alert-to-budgeter")


def test_engine_view_at_that_moment(triage: str) -> None:
    with browser_page() as page:
        page.goto(triage + "/alerts")
        page.get_by_text("Engine view at that moment").first.wait_for(timeout=60_000)
        page.get_by_text("Engine view at that moment").first.click()
        page.wait_for_url("**/engine?*", timeout=30_000)
        assert "at=" in page.url
        # "State at <time>: ..." itself: get_by_text("State at") also matches the info line's "the state at
        # that time" (substring, any case), and fails strict mode once both are on the page.
        page.get_by_text(re.compile(r"^State at \d")).wait_for(timeout=60_000)
        page.get_by_text("Showing the moment").wait_for(timeout=30_000)
        body = text_of(page)
        assert "sidecar warning" not in body  # today's warnings are not that moment's
        page.locator(".stPlotlyChart, [data-testid='stPlotlyChart']").first.locator(
            "text=alert time"
        ).first.wait_for(timeout=30_000)
        page.wait_for_timeout(2000)
        screenshot(page, "triage-engine-at-that-moment")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_chromium()
    path = tmp_path_factory.mktemp("fleet") / "fleet.db"
    engine = make_engine(f"sqlite:///{path}")
    fill_fleet(engine, 200, time.time())
    engine.dispose()
    yield from serve(path)


def test_overview_of_a_200_engine_fleet_on_one_screen(fleet: str) -> None:
    with browser_page(height=2000) as page:
        page.goto(fleet + "/")
        page.get_by_text("Needs attention").wait_for(timeout=90_000)
        chart = page.locator(".stPlotlyChart, [data-testid='stPlotlyChart']").first
        chart.locator("path.js-line").first.wait_for(state="attached", timeout=60_000)
        legend = chart.locator(".legendtext").all_text_contents()
        assert "median" in legend and len(legend) <= 5  # a distribution and the worst 3, not 200 lines
        body = text_of(page)
        assert "Needs attention (" in body and "more in the table below" in body
        page.wait_for_timeout(3000)
        screenshot(page, "triage-fleet-200-overview")
