"""Alerts: firing alerts as cards that lead to the fix (the rule's meaning, readable values, current
duration, runbook section, links to the page where the fix is applied and to the engine at that moment),
acknowledge, silence from the card; recent alerts; active silences with expiry."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from core.alerts import RULES
from dashboard import actions, data, live
from dashboard import alert_cards as cards
from dashboard import frames as q
from dashboard.auth import current_operator, signed_out_reason
from dashboard.settings import Settings
from dashboard.status import duration_text
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
SILENCE_MINUTES = 60


def _ack(row: pd.Series, ref: q.EngineRef | None) -> None:
    actions.request(
        actions.Action(
            kind="ack",
            engine=ref.key if ref else str(row["target"]),
            effect=(
                f"Acknowledge alert {row['rule']} on {ref.key if ref else row['target']} (firing since "
                f"{fmt_ts(row['started_ts'])}): it stays firing until its condition clears; the acknowledgement "
                "names you."
            ),
            params={
                "alert_id": int(row["id"]),
                "rule": row["rule"],
                "target_url": ref.sidecar_url if ref else None,
            },
        )
    )
    st.rerun()


def _silence(rule: str | None, ref: q.EngineRef, minutes: int, comment: str | None) -> None:
    actions.request(
        actions.Action(
            kind="silence",
            engine=ref.key,
            effect=(
                f"Silence rule {rule} on engine {ref.key} for {minutes} min: it still fires and shows here, but "
                "sends no notification until the silence ends."
            ),
            params={
                "rule": rule,
                "target_ids": list(ref.target_ids),
                "minutes": minutes,
                "comment": comment or None,
                "target_url": ref.sidecar_url,
            },
        )
    )
    st.rerun()


def alert_card(row: pd.Series, now: float, firing_rules_of: dict[int, set[str]]) -> None:
    alert_id = int(row["id"])
    ref = engine_of.get(int(row["target_id"])) if pd.notna(row["target_id"]) else None
    rule = str(row["rule"])
    acked_by = row["acknowledged_by"] if isinstance(row["acknowledged_by"], str) else None
    name = ref.key if ref else str(row["target"])
    with st.container(border=True, key=f"alert_{alert_id}"):
        box = st.error if row["severity"] == "critical" else st.warning
        box(
            escape_md(
                f"{str(row['severity']).upper()} {rule} on engine {name}, firing for "
                f"{duration_text(now - row['started_ts'])} (since {fmt_ts(row['started_ts'])})"
            )
        )
        causes = cards.inhibited_by(
            rule, firing_rules_of.get(int(row["target_id"]), set()) if pd.notna(row["target_id"]) else set()
        )
        if causes:
            st.warning(
                escape_md(
                    f"A symptom of {', '.join(causes)}, firing on the same target: work on that "
                    "first (this alert is inhibited while it fires)."
                )
            )
        st.markdown(escape_md(cards.meaning(rule)))
        st.text(
            f"at firing: {row['summary']}\nvalues at firing: {cards.readable_values(row['values'])}"
            + (
                f"\nacknowledged by {acked_by} {duration_text(now - row['acknowledged_ts'])} ago"
                if acked_by
                else ""
            )
            + ("\nsilenced: notifications muted" if row["silenced"] else "")
        )
        links = st.columns(4)
        if ref is not None:
            for i, (page, label) in enumerate(cards.fix_links(rule)[:2]):
                links[i].page_link(page, label=label, query_params={"engine": ref.key, "alert": rule})
            links[2].page_link(
                "pages/engine.py",
                label="Engine view at that moment",
                query_params={
                    "engine": ref.key,
                    "at": f"{row['started_ts']:.0f}",
                    "range": "1h",
                    "alert": rule,
                },
            )
        links[3].caption(f"Runbook: {cards.runbook_ref(rule)}")
        section = cards.runbook_section(rule)
        if section:
            with st.expander(f"Runbook: {rule} (what it means, confirm, what to do, undo)"):
                st.markdown(section)
        buttons = st.columns(3)
        acked = acked_by is not None
        if buttons[0].button(
            "Acknowledged" if acked else "Acknowledge",
            key=f"ack_{alert_id}",
            disabled=operator is None or acked,
            help=signed_out_reason(settings) if operator is None else None,
        ):
            _ack(row, ref)
        if ref is not None and buttons[1].button(
            f"Silence {rule} here for {SILENCE_MINUTES} min",
            key=f"silence_{alert_id}",
            disabled=operator is None,
            help=signed_out_reason(settings) if operator is None else None,
        ):
            _silence(rule, ref, SILENCE_MINUTES, f"from the alert card of alert {alert_id}")


def _expire(row: pd.Series) -> None:
    target = row["target"] if isinstance(row["target"], str) else "all targets"
    actions.request(
        actions.Action(
            kind="unsilence",
            engine=target,
            effect=(
                f"Expire the silence of {row['rule'] if isinstance(row['rule'], str) else 'all rules'} on "
                f"{target} (by {row['created_by']}, until {fmt_ts(row['ends_ts'])}) now: notifications resume."
            ),
            params={
                "silence_id": int(row["id"]),
                "rule": row["rule"] if isinstance(row["rule"], str) else None,
            },
        )
    )
    st.rerun()


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
        firing_rules_of: dict[int, set[str]] = {}
        for row in firing.itertuples():
            if pd.notna(row.target_id):
                ids = (
                    engine_of[int(row.target_id)].target_ids
                    if int(row.target_id) in engine_of
                    else (int(row.target_id),)
                )
                for tid in ids:
                    firing_rules_of.setdefault(tid, set()).add(row.rule)
        firing = firing.assign(order=firing["severity"].map(SEVERITY_ORDER).fillna(9)).sort_values(
            ["order", "started_ts"]
        )
        for _, row in firing.iterrows():
            alert_card(row, now, firing_rules_of)
    st.subheader("Recent (last 24 h)")
    if alerts.empty:
        st.caption("No alerts in the last 24 hours.")
    else:
        ends = alerts["resolved_ts"].where(alerts["resolved_ts"].notna(), now)
        shown = pd.DataFrame(
            {
                "state": alerts["state"],
                "severity": alerts["severity"],
                "rule": alerts["rule"],
                "engine": [
                    engine_of[int(t)].key if pd.notna(t) and int(t) in engine_of else str(n)
                    for t, n in zip(alerts["target_id"], alerts["target"], strict=True)
                ],
                "started (UTC)": [fmt_ts(t) for t in alerts["started_ts"]],
                "duration": [duration_text(e - s) for s, e in zip(alerts["started_ts"], ends, strict=True)],
                "resolved (UTC)": [fmt_ts(t) if pd.notna(t) else "" for t in alerts["resolved_ts"]],
                "summary": alerts["summary"],
                "values": [cards.readable_values(v) for v in alerts["values"]],
                "acknowledged by": alerts["acknowledged_by"].fillna(""),
            }
        )
        st.dataframe(shown, hide_index=True, width="stretch", key="alerts_recent")
    st.subheader("Active silences")
    if silences.empty:
        st.caption("No active silences.")
    else:
        for _, row in silences.iterrows():
            cols = st.columns([3, 3, 3, 4, 2])
            cols[0].text(row["rule"] if isinstance(row["rule"], str) else "(all rules)")
            cols[1].text(row["target"] if isinstance(row["target"], str) else "(all targets)")
            cols[2].text(f"until {fmt_ts(row['ends_ts'])} ({duration_text(row['ends_ts'] - now)} left)")
            cols[3].text(f"by {row['created_by']}: {row['comment'] or ''}")
            if cols[4].button(
                "Expire now",
                key=f"expire_{int(row['id'])}",
                disabled=operator is None,
                help=signed_out_reason(settings) if operator is None else None,
            ):
                _expire(row)


live.live_panel("alerts", settings, True, firing_panel)

st.subheader("Silence a rule on an engine")
known_rules = list(RULES)  # every rule the collectors evaluate, seen or not (a silence may precede an alert)
row = st.columns([3, 3, 2, 3, 2])
rule = row[0].selectbox(
    "Rule",
    known_rules or ["(no rules seen yet)"],
    key="silence_rule",
    disabled=operator is None or not known_rules,
)
engine_key = row[1].selectbox(
    "Engine", [e.key for e in engines], key="silence_engine", disabled=operator is None or not engines
)
minutes = row[2].selectbox(
    "For",
    [15, 60, 240, 1440],
    key="silence_minutes",
    index=1,
    format_func=lambda m: f"{m} min" if m < 60 else f"{m // 60} h",
    disabled=operator is None,
)
comment = row[3].text_input("Comment", key="silence_comment", max_chars=200, disabled=operator is None)
if row[4].button(
    "Silence",
    key="silence_add",
    disabled=operator is None or not known_rules or not engines,
    help=signed_out_reason(settings) if operator is None else None,
):
    _silence(rule, next(e for e in engines if e.key == engine_key), minutes, comment)
