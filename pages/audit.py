"""Audit: every operator action from every sidecar and the dashboard, filterable, exportable as CSV."""

from __future__ import annotations

import json
import time
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import data, live
from dashboard.settings import Settings
from dashboard.timerange import time_control
from dashboard.ui import csv_safe, ensure_router, fmt_ts, require_database

ensure_router()
settings = Settings.from_env()
url = settings.database_url
st.title("Audit")
require_database(settings)

SOURCES = ["sidecar", "dashboard", "collector"]
window = time_control(settings, key="audit", default="24h")
row = st.columns([3, 2, 2, 2])
sources = row[0].multiselect("Source", SOURCES, default=SOURCES, key="audit_sources")
actor = row[1].text_input("Who", key="audit_actor")
action = row[2].text_input("Action contains", key="audit_action")
target = row[3].text_input("Target contains", key="audit_target")


def _json(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value


def audit_table(now: float) -> pd.DataFrame:
    w = window.moving(data.live_now(settings))
    frame = data.audit(url, w.start, w.end)
    if frame.empty:
        return pd.DataFrame(
            columns=["time (UTC)", "source", "target", "who", "action", "params", "result", "before", "after"]
        )
    keep = frame["source"].isin(sources)
    if actor:
        keep &= frame["actor"].fillna("").str.contains(actor, case=False, regex=False)
    if action:
        keep &= frame["action"].fillna("").str.contains(action, case=False, regex=False)
    if target:
        keep &= frame["target"].fillna("").str.contains(target, case=False, regex=False)
    frame = frame[keep]
    return pd.DataFrame(
        {
            "time (UTC)": [fmt_ts(t) for t in frame["ts"]],
            "source": frame["source"],
            "target": frame["target"].fillna(""),
            "who": frame["actor"].fillna(""),
            "action": frame["action"].fillna(""),
            "params": [_json(v) for v in frame["params"]],
            "result": frame["outcome"].fillna(""),
            "before": [_json(v) for v in frame["before"]],
            "after": [_json(v) for v in frame["after"]],
        }
    )


def audit_panel() -> None:
    now = time.time()
    try:
        table = audit_table(now)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        return
    st.caption(
        f"{len(table)} entries, newest first. As of {fmt_ts(now)}; sidecar entries arrive with the "
        "collectors' next scrape of that sidecar's audit."
    )
    st.dataframe(table, hide_index=True, width="stretch", key="audit_table")
    st.download_button(
        "Export CSV",
        csv_safe(table),
        file_name=f"prefixops-audit-{int(now)}.csv",
        mime="text/csv",
        key="audit_csv",
    )


live.live_panel("audit", settings, window.live, audit_panel)
