"""PrefixOps dashboard: `streamlit run app.py`.

The entry point is a router: it sets up the page, the sidebar (sign-in and the
collectors' heartbeat), the confirmation dialog of a pending action, and runs
the page chosen in the navigation. Pages read only the database and act only
through the sidecars' control API (see `dashboard/`).
"""

from __future__ import annotations

import logging

import streamlit as st

from dashboard import actions
from dashboard.settings import Settings, SettingsError
from dashboard.sidebar import render_heartbeat, render_sign_in
from dashboard.ui import ROUTER_KEY

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

st.set_page_config(page_title="PrefixOps", page_icon="🧮", layout="wide")

# Page files are named <name>_page.py with url_path <name> on purpose: with a pages/ folder, Streamlit 1.67
# still registers the legacy file-based pages, and a legacy page whose name equals a navigation url_path
# shares its page hash, so the page file ran without this router (no sidebar, sign-in or dialog), in
# AppTest's switch_page and for the first visitor of a deep link after a server start (measured here).
PAGES = [
    st.Page("pages/overview_page.py", title="Overview", url_path="overview", default=True),
    st.Page("pages/engine_page.py", title="Engine", url_path="engine"),
    st.Page("pages/sessions_page.py", title="Sessions", url_path="sessions"),
    st.Page("pages/budgeter_page.py", title="Budgeter", url_path="budgeter"),
    st.Page("pages/compaction_page.py", title="Compaction", url_path="compaction"),
    st.Page("pages/alerts_page.py", title="Alerts", url_path="alerts"),
    st.Page("pages/audit_page.py", title="Audit", url_path="audit"),
]

page = st.navigation(PAGES)
st.session_state[ROUTER_KEY] = True

try:
    settings = Settings.from_env()
except SettingsError as exc:
    st.error(f"Dashboard configuration error: {exc}")
    st.stop()

render_sign_in(settings)
render_heartbeat(settings)
actions.render_pending(settings)
actions.render_outcome()
page.run()
