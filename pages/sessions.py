"""Sessions: every session a sidecar knows, filterable and sortable; park and unpark one or several."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dashboard import actions, data, live, misses
from dashboard import frames as q
from dashboard.auth import current_operator, signed_out_reason
from dashboard.status import age_text
from dashboard.ui import escape_md, fmt_ts, open_sidecar_page

settings, ref = open_sidecar_page("Sessions", "sessions are known only to a sidecar.")
url = settings.database_url

STATES = ["admitted", "parked", "waiting"]
filters = st.columns([3, 3, 2])
chosen_states = filters[0].multiselect("State", STATES, default=STATES, key="sessions_state_filter")
id_filter = filters[1].text_input("Session id contains", key="sessions_id_filter")
min_context = filters[2].number_input(
    "Min context tokens", min_value=0, value=0, step=1000, key="sessions_min_ctx"
)


def session_table(frame: pd.DataFrame, now: float) -> pd.DataFrame:
    if frame.empty:
        return pd.DataFrame(
            columns=[
                "session",
                "state",
                "context tokens",
                "turns",
                "last cached fraction",
                "parked for",
                "parked by",
                "pinned",
                "first seen",
            ]
        )
    parked = frame["state"] == "parked"
    out = pd.DataFrame(
        {
            "session": frame["session_id"].astype(str),
            "state": frame["state"].fillna("?"),
            "context tokens": frame["context_tokens"],
            "turns": frame["turns"],
            "last cached fraction": frame["last_cached_fraction"],
            "parked for": [
                age_text(now - p).removesuffix(" ago") if isinstance(p, float) and is_p and p == p else ""
                for p, is_p in zip(frame["parked_since"], parked, strict=True)
            ],
            "parked by": [
                "operator" if m else "budgeter" if is_p else ""
                for m, is_p in zip(frame["manual"].fillna(False), parked, strict=True)
            ],
            "pinned": frame["pinned"].fillna(False).astype(bool),
            "first seen": [fmt_ts(t) for t in frame["first_seen_ts"]],
        }
    )
    return out


def filtered(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    keep = frame["state"].isin(chosen_states)
    if id_filter:
        keep &= frame["session_id"].astype(str).str.contains(id_filter, case=False, regex=False)
    if min_context:
        keep &= frame["context_tokens"].fillna(0) >= min_context
    return frame[keep]


def table_panel() -> None:
    now = time.time()
    try:
        frame = data.sessions(url, (ref.sidecar_target_id,))
        health = data.health(url).get(ref.sidecar_target_id)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        return
    if health is not None and (
        not health.up or (health.last_success_ts or 0) < now - settings.stale_after_seconds
    ):
        st.warning(
            escape_md(
                f"Sidecar {health.name} is {'down' if not health.up else 'not scraped recently'}: this "
                f"list is as of its last good scrape, {age_text(now - (health.last_success_ts or 0))}."
            )
        )
    counts = frame["state"].value_counts().to_dict() if not frame.empty else {}
    st.caption(
        f"{len(frame)} sessions: "
        + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATES)
        + f". As of {fmt_ts(now)}; refreshes every {settings.refresh_seconds:g} s. Click a column to sort."
    )
    st.dataframe(
        session_table(filtered(frame), now),
        hide_index=True,
        width="stretch",
        key="sessions_table",
        column_config={
            "last cached fraction": st.column_config.ProgressColumn(format="%.2f", min_value=0, max_value=1),
            "context tokens": st.column_config.NumberColumn(format="%d"),
        },
    )


live.live_panel("sessions_table", settings, True, table_panel)


def misses_panel() -> None:
    st.subheader("Sessions with the most missed tokens (last hour)")
    now = data.live_now(settings)
    try:
        misses.sessions_panel(url, ref, now - 3600, now)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))


live.live_panel("sessions_misses", settings, True, misses_panel)

st.subheader("Park or unpark")
operator = current_operator(settings)
if operator is None:
    st.info(signed_out_reason(settings))
try:
    current = filtered(data.sessions(url, (ref.sidecar_target_id,)))
except data.DatabaseUnavailable as exc:
    st.error(str(exc))
    st.stop()
options = list(current["session_id"].astype(str)) if not current.empty else []
# No "Select all" entry in a destructive picker: parking everyone is never one slip away.
selected = st.multiselect(
    "Sessions to act on (from the filtered list)",
    options,
    key="sessions_selected",
    disabled=operator is None,
    select_all=False,
)
pin = st.checkbox(
    "Pin when unparking (exempt from automatic parking until the session ends)",
    key="sessions_pin",
    disabled=operator is None,
)
cols = st.columns(4)
park_clicked = cols[0].button(
    "Park selected",
    key="park_selected",
    disabled=operator is None or not selected,
    help=None if operator else signed_out_reason(settings),
)
unpark_clicked = cols[1].button(
    "Unpark selected",
    key="unpark_selected",
    disabled=operator is None or not selected,
    help=None if operator else signed_out_reason(settings),
)


def _request(kind: str, ids: list[str], ref: q.EngineRef) -> None:
    n = len(ids)
    if kind == "park":
        effect = (
            f"Park {n} session(s) on engine {ref.key}: their next turns will wait at the sidecar until "
            "unparked, and their cached prefixes may be evicted meanwhile."
        )
    else:
        effect = (
            f"Unpark {n} session(s) on engine {ref.key}: they are admitted at once, even above the high band"
            + (", and pinned (never parked automatically until they end)." if pin else ".")
        )
    actions.request(
        actions.Action(
            kind=kind,
            effect=effect,
            engine=ref.key,
            sidecar_target_id=ref.sidecar_target_id,
            sidecar_url=ref.sidecar_url,
            sidecar_name=ref.sidecar_name,
            session_ids=tuple(ids),
            params={"pin": pin} if kind == "unpark" else {},
        )
    )
    st.rerun()


if park_clicked and operator is not None:
    _request("park", selected, ref)
if unpark_clicked and operator is not None:
    _request("unpark", selected, ref)
