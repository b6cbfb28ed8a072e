"""Incident: an incident bundle (`python -m collectors export-incident`) opened read-only: the Engine page's
charts over the bundle's range with markers, and the timeline of alerts and actions. No database needed."""

from __future__ import annotations

import gzip
import json

import streamlit as st

from collectors.incident import FORMAT, IncidentError, read_bundle
from dashboard import charts, engine_view, incident_view
from dashboard.settings import Settings
from dashboard.ui import ensure_router, escape_md

ensure_router()
settings = Settings.from_env()
st.title("Incident")
st.caption(
    "Open a bundle written by `python -m collectors export-incident --engine E --from T1 --to T2 --out FILE`. "
    "Read-only: nothing here acts on an engine."
)

upload = st.file_uploader("Bundle (.json or .json.gz)", type=["json", "gz"], key="incident_upload")
path = st.text_input(
    "…or a bundle's path on the dashboard's host",
    key="incident_path",
    value=st.query_params.get("bundle", ""),
)
doc = None
try:
    if upload is not None:
        raw = upload.getvalue()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise IncidentError(f"{upload.name}: not an incident bundle (format is not {FORMAT!r})")
    elif path:
        doc = read_bundle(path)
except (IncidentError, ValueError, OSError) as exc:
    st.error(escape_md(str(exc)))
    st.stop()
if doc is None:
    st.stop()

start, end = float(doc["from"]), float(doc["to"])
st.subheader(
    escape_md(
        f"Engine {doc['engine']}: {charts.to_time(start):%Y-%m-%d %H:%M:%S} to "
        f"{charts.to_time(end):%Y-%m-%d %H:%M:%S} UTC"
    )
)
st.caption(
    escape_md(", ".join(f"{t['role']} {t.get('name') or ''} ({t['url']})" for t in doc["targets"]))
    + f". {len(doc.get('turns', []))} turns, {len(doc.get('alerts', []))} alerts, "
    f"{len(doc.get('audit', []))} audit actions."
)
frame, eng = incident_view.signal_frames(doc)
events = incident_view.events(doc)
common = dict(
    start=start, end=end, now=end, stale_after=max(end - start, 1.0), max_gap=max(60.0, (end - start) / 50)
)
figures = engine_view.figures(frame, eng, events, settings, common)
st.plotly_chart(figures["hit"], key="incident_hit_rates", width="stretch")
left, right = st.columns(2)
with left:
    st.plotly_chart(figures["kv"], key="incident_kv", width="stretch")
with right:
    st.plotly_chart(figures["backlog"], key="incident_backlog", width="stretch")
st.subheader("Timeline of alerts and actions")
table = incident_view.timeline(doc)
if table.empty:
    st.caption("No alerts or actions in this bundle.")
else:
    table.insert(0, "time (UTC)", [charts.to_time(t).strftime("%Y-%m-%d %H:%M:%S") for t in table["ts"]])
    st.dataframe(table.drop(columns="ts"), hide_index=True, width="stretch", key="incident_timeline")
st.subheader("Settings in force")
st.json(doc.get("settings", {}), expanded=False)
