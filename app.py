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
from dashboard.auth import current_identity
from dashboard.settings import Settings, SettingsError
from dashboard.sidebar import render_heartbeat, render_sign_in
from dashboard.ui import route_default_alias

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

st.set_page_config(page_title="PrefixOps", page_icon="🧮", layout="wide")

# Each page file is named like its url_path. Streamlit 1.67 runs the very first script run of a server
# process in its legacy pages/ mode; the names match, so a deep link (an alert's "engine view at that
# moment") resolves to its page there too, and dashboard.ui.ensure_router() reruns it through this router.
PAGES = [
    st.Page("pages/overview.py", title="Overview", url_path="overview", default=True),
    st.Page("pages/engine.py", title="Engine", url_path="engine"),
    st.Page("pages/sessions.py", title="Sessions", url_path="sessions"),
    st.Page("pages/budgeter.py", title="Budgeter", url_path="budgeter"),
    st.Page("pages/compaction.py", title="Compaction", url_path="compaction"),
    st.Page("pages/alerts.py", title="Alerts", url_path="alerts"),
    st.Page("pages/audit.py", title="Audit", url_path="audit"),
    st.Page("pages/incident.py", title="Incident", url_path="incident"),
]
ACCOUNTS_PAGE = st.Page("pages/accounts.py", title="Accounts", url_path="accounts")

try:
    settings = Settings.from_env()
except SettingsError as exc:
    route_default_alias("overview")
    st.navigation(PAGES)
    st.error(f"Dashboard configuration error: {exc}")
    st.stop()

# The Accounts page is listed for admins only (the page checks the role again).
who = current_identity(settings)
route_default_alias("overview")
page = st.navigation(PAGES + ([ACCOUNTS_PAGE] if who is not None and who.may_manage_accounts else []))

render_sign_in(settings)
render_heartbeat(settings)
actions.render_pending(settings)
actions.render_outcome()
page.run()
