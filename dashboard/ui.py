"""Shared page pieces: engine and time-range selection (kept in the URL), escaping, formatting."""

from __future__ import annotations

import logging
import re
import runpy
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import data
from dashboard.frames import EngineRef
from dashboard.settings import Settings
from dashboard.timerange import TimeWindow

logger = logging.getLogger(__name__)

APP_SCRIPT = Path(__file__).resolve().parent.parent / "app.py"
LAST_ENGINE_KEY = "last_engine"
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:=^&])")


def escape_md(text: object) -> str:
    """Text from engines or sidecars, made inert for Streamlit's Markdown (no links, HTML, emphasis)."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", "  \n")


def fmt_ts(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_tokens(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1_000_000:
        return f"{value / 1e6:.2f}M"
    if abs(value) >= 1_000:
        return f"{value / 1e3:.0f}K"
    return f"{value:.0f}"


def ensure_router() -> None:
    """Route a page that Streamlit ran without app.py through app.py, in the same run.

    Streamlit 1.67 decides per server process whether the app uses the legacy
    pages/ folder: until the first `st.navigation` call it runs the files in
    pages/ directly (no sidebar, sign-in or page config), resolving the URL
    against their file names (AppTest resets that decision before every run).
    So the first visitor after a server start of a deep link, e.g. an alert's
    link to the Engine page, lands here with the flag still set: run app.py
    now, which routes the same URL to this page properly, and stop this
    unrouted run. Page files are named like their url_path so the legacy mode
    resolves them at all; otherwise it shows "Page not found" first.
    """
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        runpy.run_path(str(APP_SCRIPT), run_name="__main__")
        st.stop()


def route_default_alias(default_url_path: str) -> None:
    """Let ``/<default_url_path>`` reach the default page (called before `st.navigation`).

    `st.navigation` serves the default page at the root only (its url_path reads ""), so a deep link to
    ``/overview`` would show "Page not found" and then the main page. The intent is rewritten to the
    root before the pages are resolved."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    manager = getattr(ctx, "pages_manager", None)
    if (
        manager is not None
        and not manager.intended_page_script_hash
        and manager.intended_page_name == default_url_path
    ):
        manager.set_script_intent("", "")


def open_sidecar_page(title: str, without_sidecar: str) -> tuple[Settings, EngineRef]:
    """The common head of the pages that read and act through an engine's sidecar.

    Routes the run, titles the page, and returns the settings and the chosen
    engine; stops the page with a plain message when there is no database, no
    engine, or no sidecar in front of the chosen engine (``without_sidecar``
    says what is therefore missing).
    """
    ensure_router()
    settings = Settings.from_env()
    st.title(title)
    require_database(settings)
    try:
        engines = data.engines(settings.database_url)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        st.stop()
    ref = choose_engine(engines)
    if ref is None:
        st.stop()
    if ref.sidecar_target_id is None:
        st.warning(f"No sidecar fronts this engine: {without_sidecar}")
        st.stop()
    return settings, ref


def require_database(settings: Settings) -> None:
    """Stop the page with a clear message when there is no database to read."""
    problem = data.database_problem(settings.database_url)
    if problem:
        st.warning(problem)
        st.stop()


def choose_engine(engines: list[EngineRef], *, key: str = "engine") -> EngineRef | None:
    """Engine picker synced with `?engine=`; opens on the first engine when none is chosen."""
    if not engines:
        st.info(
            "No engines known yet: the collectors have not recorded any targets. "
            "Check PREFIXOPS_CONFIG / the collectors' command line."
        )
        return None
    keys = [e.key for e in engines]
    wanted = st.query_params.get("engine") or st.session_state.get(LAST_ENGINE_KEY)
    if wanted is not None and wanted not in keys:
        st.warning(f"Engine {escape_md(wanted)} is not known (any more); showing {escape_md(keys[0])}.")
        wanted = None
    index = keys.index(wanted) if wanted in keys else 0
    chosen = st.selectbox("Engine", keys, index=index, key=f"{key}_select")
    st.session_state[LAST_ENGINE_KEY] = chosen
    if st.query_params.get("engine") != chosen:
        st.query_params["engine"] = chosen
    return engines[keys.index(chosen)]


def max_gap_for(window: TimeWindow) -> float:
    """A missing stretch longer than this is drawn as a gap."""
    from dashboard.frames import step_for_span

    step = step_for_span(window.span)
    return max(10.0, 3 * step)


def admission_wait_limit() -> float | None:
    """The ``admission-wait`` alert's limit in force (seconds), or None when the rules have none."""
    return getattr(data.alert_settings(Settings.from_env().config_path), "admission_wait_s", None)


def csv_safe(frame: pd.DataFrame) -> bytes:
    """CSV in which no cell can run as a spreadsheet formula (session ids and names come from clients)."""

    def cell(value: object) -> object:
        if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
            return "'" + value
        return value

    return frame.map(cell).to_csv(index=False).encode()
