"""Alerts: firing and recent alerts with their values, a link to the engine at that moment; ack; silence."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from core.alerts import RULES
from dashboard import actions, data
from dashboard import frames as q
from dashboard.auth import current_operator, signed_out_reason
from dashboard.settings import Settings
from dashboard.status import age_text
from dashboard.ui import ensure_router, escape_md, fmt_ts, require_database

ensure_router()
settings = Settings.from_env()
url = settings.database_url
st.title("Alerts")
require_database(settings)
operator = current_operator(settings)
if operator is None:
    st.info(signed_out_reason(settings))

try:
    engines = data.engines(url)
except data.DatabaseUnavailable as exc:
    st.error(str(exc))
    st.stop()
engine_of: dict[int, q.EngineRef] = {t: e for e in engines for t in e.target_ids}
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def _ack(row: pd.Series, ref: q.EngineRef | None) -> None:
    actions.request(actions.Action(
        kind="ack", engine=ref.key if ref else str(row["target"]),
        effect=(f"Acknowledge alert {row['rule']} on {ref.key if ref else row['target']} (firing since "
                f"{fmt_ts(row['started_ts'])}): it stays firing until its condition clears; the acknowledgement "
                "names you."),
        params={"alert_id": int(row["id"]), "rule": row["rule"],
                "target_url": ref.sidecar_url if ref else None}))
    st.rerun()


@st.fragment(run_every=settings.refresh_seconds)
def firing_panel() -> None:
    now = time.time()
    try:
        alerts = data.alerts(url, now - 86400)
        silences = data.silences(url, data.live_now(settings))
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        return
    firing = alerts[alerts["state"] == "firing"] if not alerts.empty else alerts
    st.subheader(f"Firing ({len(firing)})")
    if firing.empty:
        st.success("Nothing is firing.")
    else:
        firing = firing.assign(order=firing["severity"].map(SEVERITY_ORDER).fillna(9)).sort_values(
            ["order", "started_ts"])
        for _, row in firing.iterrows():
            ref = engine_of.get(int(row["target_id"])) if pd.notna(row["target_id"]) else None
            acked_by = row["acknowledged_by"] if isinstance(row["acknowledged_by"], str) else None
            with st.container(border=True, key=f"alert_{int(row['id'])}"):
                head = st.columns([5, 2, 2])
                box = st.error if row["severity"] == "critical" else st.warning
                with head[0]:
                    box(escape_md(f"{row['severity'].upper()} {row['rule']} on engine "
                                  f"{ref.key if ref else row['target']}, firing for "
                                  f"{age_text(now - row['started_ts']).removesuffix(' ago')}"))
                    st.text(f"{row['summary']}\nvalues: {row['values']}\nsince {fmt_ts(row['started_ts'])}"
                            + (f"\nacknowledged by {acked_by} {age_text(now - row['acknowledged_ts'])}"
                               if acked_by else "")
                            + ("\nsilenced: notifications muted" if row["silenced"] else ""))
                if ref is not None:
                    head[1].page_link("pages/engine.py", label="Engine view at that moment",
                                      query_params={"engine": ref.key, "at": f"{row['started_ts']:.0f}",
                                                    "range": "1h"})
                acked = acked_by is not None
                if head[2].button("Acknowledged" if acked else "Acknowledge", key=f"ack_{int(row['id'])}",
                                  disabled=operator is None or acked,
                                  help=signed_out_reason(settings) if operator is None else None):
                    _ack(row, ref)
    st.subheader("Recent (last 24 h)")
    if alerts.empty:
        st.caption("No alerts in the last 24 hours.")
    else:
        shown = pd.DataFrame({
            "state": alerts["state"], "severity": alerts["severity"], "rule": alerts["rule"],
            "engine": [engine_of[int(t)].key if pd.notna(t) and int(t) in engine_of else str(n)
                       for t, n in zip(alerts["target_id"], alerts["target"], strict=True)],
            "started (UTC)": [fmt_ts(t) for t in alerts["started_ts"]],
            "resolved (UTC)": [fmt_ts(t) if pd.notna(t) else "" for t in alerts["resolved_ts"]],
            "summary": alerts["summary"],
            "values": [str(v) for v in alerts["values"]],
            "acknowledged by": alerts["acknowledged_by"].fillna(""),
        })
        st.dataframe(shown, hide_index=True, width="stretch", key="alerts_recent")
    st.subheader("Active silences")
    if silences.empty:
        st.caption("No active silences.")
    else:
        st.dataframe(pd.DataFrame({
            "rule": silences["rule"].fillna("(all rules)"),
            "target": silences["target"].fillna("(all targets)"),
            "until (UTC)": [fmt_ts(t) for t in silences["ends_ts"]],
            "by": silences["created_by"], "comment": silences["comment"].fillna(""),
        }), hide_index=True, width="stretch", key="alerts_silences")


firing_panel()

st.subheader("Silence a rule on an engine")
known_rules = list(RULES)  # every rule the collectors evaluate, seen or not (a silence may precede an alert)
row = st.columns([3, 3, 2, 3, 2])
rule = row[0].selectbox("Rule", known_rules or ["(no rules seen yet)"], key="silence_rule",
                        disabled=operator is None or not known_rules)
engine_key = row[1].selectbox("Engine", [e.key for e in engines], key="silence_engine",
                              disabled=operator is None or not engines)
minutes = row[2].selectbox("For", [15, 60, 240, 1440], key="silence_minutes", index=1,
                           format_func=lambda m: f"{m} min" if m < 60 else f"{m // 60} h",
                           disabled=operator is None)
comment = row[3].text_input("Comment", key="silence_comment", max_chars=200, disabled=operator is None)
if row[4].button("Silence", key="silence_add", disabled=operator is None or not known_rules or not engines,
                 help=signed_out_reason(settings) if operator is None else None):
    ref = next(e for e in engines if e.key == engine_key)
    actions.request(actions.Action(
        kind="silence", engine=ref.key,
        effect=(f"Silence rule {rule} on engine {ref.key} for {minutes} min: it still fires and shows here, but "
                "sends no notification until the silence ends."),
        params={"rule": rule, "target_ids": list(ref.target_ids), "minutes": minutes,
                "comment": comment or None, "target_url": ref.sidecar_url}))
    st.rerun()
