"""Browser test (issue 16 item 3): the Budgeter page's "Preview the next N minutes" in Debian's Chromium.

A filled database (tests/dashboard/fill.py) plus 30 minutes of turn rows shaped like the collapse demo's
traffic for engine ``a``'s sidecar, and a fit file of engine ``a`` (``PREFIXOPS_FIT``). The operator runs the
forecast (180 minutes) of `off` against the current `budgeter-park`; the page comes back with a progress bar while the job runs (forecast-budgeter-progress.png), then shows the current and the proposed runs side by side; then a quarter of an hour, the median of five draws with their ranges
(forecast-budgeter-draws.png). Screenshot:
artifacts/screenshots/forecast-budgeter.png.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from bench.bench_forecast import FIT, recorded
from db import models
from tests.browser.pw import (
    FRESH_FILL,
    browser_page,
    open_page,
    require_chromium,
    screenshot,
    streamlit_app,
    wait_idle,
)
from tests.dashboard.fill import ENGINES, filled_engine

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_chromium()
    base = tmp_path_factory.mktemp("forecast")
    path: Path = base / "filled.db"
    engine, now = filled_engine(f"sqlite:///{path}")
    turns, _ = recorded(now)
    with engine.begin() as conn:
        side = conn.execute(select(models.Target.id).where(models.Target.name == "a-sidecar")).scalar_one()
        conn.execute(
            insert(models.Turn),
            [
                {
                    "target_id": side,
                    "remote_id": 1_000_000 + t["id"],
                    "ts": t["ts"],
                    "session_id": t["session"],
                    "prompt_tokens": t["prompt_tokens"],
                    "cached_tokens": t["cached_tokens"],
                    "completion_tokens": t["completion_tokens"],
                    "held_s": t["held_s"],
                    "parked_s": 0.0,
                    "latency_s": t["latency_s"],
                    "outcome": t["outcome"],
                }
                for t in turns
            ],
        )
    engine.dispose()
    fit = base / "fit.json"
    fit.write_text(json.dumps({"engine": ENGINES["a"]["engine_url"], "set": FIT}))
    env = {**FRESH_FILL, "PREFIXOPS_REFRESH_SECONDS": "5", "PREFIXOPS_FIT": str(fit)}
    with streamlit_app(f"sqlite:///{path}", env) as url:
        yield url


def test_forecast_runs_in_the_background_and_shows_both_runs(dashboard: str) -> None:
    with browser_page() as page:
        open_page(page, f"{dashboard}/budgeter?engine=a")
        assert page.get_by_text("Preview the next N minutes").count() == 1
        page.locator("[data-testid='stSelectbox']").filter(has_text="Mode").last.click()
        page.get_by_role("option", name="off", exact=True).click()
        wait_idle(page)
        minutes = page.get_by_role("spinbutton", name="Minutes")
        minutes.fill("180")
        minutes.press("Enter")
        wait_idle(page)
        page.get_by_role("button", name="Run forecast").click()
        progress = page.get_by_text("Forecasting 180 minutes")
        progress.first.wait_for(state="attached", timeout=60_000)  # the page is back while the job runs
        screenshot(page, "forecast-budgeter-progress")
        table = page.locator("[data-testid='stDataFrame']").filter(has_text="proposed")
        table.first.wait_for(state="attached", timeout=120_000)
        caption = page.get_by_text("cost model from fit").first
        assert caption.is_visible()
        assert table.first.get_by_text("proposed: off 0.75-0.95").count() == 1 or "off 0.75" in (
            table.first.inner_text()
        )
        page.wait_for_timeout(1500)
        wait_idle(page)
        assert page.locator("[data-testid='stException']").count() == 0
        screenshot(page, "forecast-budgeter")

        # a quarter of an hour: five draws per config, each cell their median with the range
        minutes.fill("15")
        minutes.press("Enter")
        wait_idle(page)
        page.get_by_role("button", name="Run forecast").click()
        page.get_by_text("the median of 5 draws").first.wait_for(state="attached", timeout=120_000)
        page.wait_for_timeout(1500)
        wait_idle(page)
        assert page.locator("[data-testid='stException']").count() == 0
        screenshot(page, "forecast-budgeter-draws")
