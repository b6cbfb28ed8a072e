"""Playwright helpers for the browser tests: Debian's Chromium, Streamlit readiness, screenshots.

Runnable by hand to look at a running dashboard::

    .venv/bin/python -m tests.browser.pw http://127.0.0.1:8501 overview engine ...
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support import ARTIFACTS, PYTHON, free_port, running, unavailable

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = ARTIFACTS / "screenshots"
# A filled database is "now" when it is filled; these keep it fresh for the length of a test module.
FRESH_FILL = {"PREFIXOPS_STALE_SECONDS": "600", "PREFIXOPS_HEARTBEAT_STALE_SECONDS": "600"}


def require_chromium() -> None:
    """Skip (with the reason) when Chromium is missing, except under CI=true, where it fails."""
    if Path(CHROMIUM).exists() or shutil.which("chromium"):
        return
    reason = f"{CHROMIUM} is missing (install it with `apt-get install -y chromium`)"
    unavailable("browser tests", reason)


@contextmanager
def browser_page(width: int = 1400, height: int = 2600) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            page = context.new_page()
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


@contextmanager
def streamlit_app(
    database_url: str, env: Mapping[str, str] | None = None, port: int | None = None
) -> Iterator[str]:
    """`streamlit run app.py` over ``database_url`` on a loopback port (a free one unless given).

    Yields the base URL once ``/_stcore/health`` answers ``ok``; ``env`` adds to the process's
    environment (``DATABASE_URL`` is set from ``database_url``). The server stops on exit.
    """
    port = port or free_port()
    cmd = [
        PYTHON,
        "-m",
        "streamlit",
        "run",
        "app.py",
        "--server.port",
        str(port),
        "--server.headless",
        "true",
    ]
    base = f"http://127.0.0.1:{port}"
    with running(
        cmd,
        name="streamlit",
        ready_url=f"{base}/_stcore/health",
        env={"DATABASE_URL": database_url, **(env or {})},
        expect_text="ok",
        timeout=60,
    ):
        yield base


def wait_idle(page: Any, timeout_ms: int = 30_000) -> None:
    """Wait until the script run finished (stApp data-test-script-state="notRunning")."""
    page.wait_for_selector(
        '[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout_ms, state="attached"
    )


def open_page(page: Any, url: str, timeout_ms: int = 60_000) -> None:
    """Load ``url`` and wait for its script run to finish: a first run on a cold server (its imports,
    the first database read) can take half a minute on a loaded two-core machine."""
    page.goto(url)
    wait_idle(page, timeout_ms)


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


if __name__ == "__main__":
    base = sys.argv[1]
    names = sys.argv[2:] or ["overview"]
    with browser_page() as pg:
        for name in names:
            path_part, _, query = name.partition("?")
            open_page(pg, f"{base}/{path_part}" + (f"?{query}" if query else ""))
            pg.wait_for_timeout(2500)
            wait_idle(pg)
            print(screenshot(pg, f"manual-{path_part}"))
