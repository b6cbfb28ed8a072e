"""Browser test (issue 2): a real `streamlit run app.py` over a filled database, in Debian's Chromium.

The Overview must show the hit-rate chart with data; every page is screenshotted
into artifacts/screenshots/ (filled-*.png) so a person can look at them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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

pytestmark = pytest.mark.browser

NAV_LABELS = ["Overview", "Engine", "Sessions", "Budgeter", "Compaction", "Alerts", "Audit", "Incident"]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_chromium()
    path: Path = tmp_path_factory.mktemp("browser") / "filled.db"
    engine, _now = filled_engine(f"sqlite:///{path}")
    engine.dispose()
    # A refresh longer than a page's run on a loaded 2-core machine, so the page is seen idle.
    with streamlit_app(f"sqlite:///{path}", {**FRESH_FILL, "PREFIXOPS_REFRESH_SECONDS": "5"}) as base:
        yield base


def test_overview_shows_the_hit_rate_chart_with_data(dashboard: str) -> None:
    with browser_page() as page:
        open_page(page, dashboard + "/")
        chart = page.locator(".stPlotlyChart, [data-testid='stPlotlyChart']").first
        chart.locator("path.js-line").first.wait_for(state="attached")
        title = chart.locator(".gtitle").text_content() or ""
        assert "R_t across engines" in title
        lines = chart.locator("path.js-line")
        drawn = [lines.nth(i).get_attribute("d") or "" for i in range(lines.count())]
        # plotly simplifies near-collinear runs, so a drawn line has a few segments, not one per sample
        assert sum(1 for d in drawn if d.count("L") >= 3) >= 3, [d[:80] for d in drawn]
        legend = chart.locator(".legendtext").all_text_contents()
        assert {"median", "p10-p90 of engines", "a", "b"} <= set(legend)
        table = page.locator("[data-testid='stDataFrame']").first
        assert table.is_visible()
        nav = page.locator("[data-testid='stSidebarNav'] a").all_inner_texts()
        assert [n.strip() for n in nav] == NAV_LABELS
        page.wait_for_timeout(500)
        wait_idle(page)
        screenshot(page, "filled-overview")


FILLED_PAGES = [
    "engine?engine=a",
    "engine?engine=b&range=24h",
    "sessions?engine=a",
    "budgeter?engine=a",
    "compaction?engine=a",
    "alerts",
    "audit",
]


def test_every_page_renders_over_the_filled_database(dashboard: str) -> None:
    with browser_page() as page:
        for path in FILLED_PAGES:
            open_page(page, f"{dashboard}/{path}")
            page.wait_for_timeout(800)
            wait_idle(page)
            assert page.locator("[data-testid='stException']").count() == 0, path
            assert page.locator("h1").first.inner_text().strip() in NAV_LABELS, path
            name = path.replace("?", "-").replace("&", "-").replace("=", "-")
            screenshot(page, f"filled-{name}")


def test_alert_link_opens_the_engine_at_that_moment(dashboard: str) -> None:
    with browser_page() as page:
        open_page(page, f"{dashboard}/alerts")
        page.get_by_text("Engine view at that moment").first.click()
        page.wait_for_url("**/engine?*", timeout=30_000)
        assert "at=" in page.url
        page.get_by_text("Showing the moment").wait_for(timeout=60_000)
        assert page.get_by_role("button", name="Back to live").is_visible()
        screenshot(page, "filled-engine-at-alert")


def test_first_visitor_of_a_deep_link_after_a_server_start_gets_the_routed_page(tmp_path: Path) -> None:
    """Streamlit's first script run of a process is in its legacy pages/ mode (see dashboard.ui.ensure_router):
    an alert link opened right after a restart must land on that page, routed, without a "Page not found"."""
    require_chromium()
    path = tmp_path / "filled.db"
    engine, _now = filled_engine(f"sqlite:///{path}")
    engine.dispose()
    with (
        streamlit_app(f"sqlite:///{path}", {"PREFIXOPS_REFRESH_SECONDS": "5"}) as base,
        browser_page() as page,
    ):
        open_page(page, f"{base}/engine?engine=a&range=24h")
        page.wait_for_timeout(1500)
        wait_idle(page)
        assert "Page not found" not in page.content()
        assert page.locator("h1").first.inner_text().strip() == "Engine"
        assert (
            page.get_by_label("Password", exact=True).count() == 1
        )  # the router's sidebar (sign-in form) ran
        assert "range=24h" in page.url
