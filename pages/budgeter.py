"""Budgeter: mode, bands and pool; change them, validated, with a preview from the sidecar's own policy code."""

from __future__ import annotations

import time

import streamlit as st

from core.budgeter import CONTROLS, BudgeterConfig, ConfigError
from dashboard import actions, data
from dashboard import preview as pv
from dashboard.auth import current_operator, signed_out_reason
from dashboard.status import age_text
from dashboard.ui import escape_md, fmt_tokens, open_sidecar_page

settings, ref = open_sidecar_page("Budgeter", "there is no budgeter to show or change.")
url = settings.database_url

now = time.time()
try:
    side = data.sidecar_states(url).get(ref.sidecar_target_id)
    sessions = data.sessions(url, (ref.sidecar_target_id,))
except data.DatabaseUnavailable as exc:
    st.error(str(exc))
    st.stop()
if not side or not isinstance(side.get("state"), dict):
    st.warning("The collectors have not recorded this sidecar's /state yet.")
    st.stop()
state = side["state"].get("budgeter") or {}
age = now - side["ts"]
if age > settings.stale_after_seconds:
    st.warning(f"The sidecar's state is {age_text(age)}: what follows may no longer be true.")

try:
    current = pv.current_config(state)
except ConfigError as exc:
    st.error(escape_md(f"The sidecar reports a budgeter config this dashboard cannot read: {exc}"))
    st.stop()
pool = state.get("pool_tokens")
demand = state.get("demand_tokens")
cols = st.columns(5)
cols[0].metric("Mode", current.mode)
cols[1].metric("Low band", f"{current.low:.2f}", help="admit new or parked sessions while demand is below")
cols[2].metric("High band", f"{current.high:.2f}", help="park at turn boundaries while demand is above")
cols[3].metric("KV pool", fmt_tokens(pool), help=escape_md(f"source: {state.get('pool_source') or 'unknown'}"))
cols[4].metric("Demand", f"{fmt_tokens(demand)}" + (f" ({demand / pool:.0%})" if demand is not None and pool else ""))
if pool is None:
    st.warning("The KV pool size is unknown: the budgeter cannot act on token bands (see the sidecar's warnings "
               "on the Engine page).")
backlog = side["state"].get("backlog") or {}
st.caption(escape_md(f"As of {age_text(age)}: {backlog.get('admitted', '?')} admitted, {backlog.get('parked', '?')} "
                     f"parked, {backlog.get('waiting', '?')} waiting."))

st.subheader("Change mode and bands")
operator = current_operator(settings)
if operator is None:
    st.info(signed_out_reason(settings))
form = st.columns(3)
mode = form[0].selectbox("Mode", CONTROLS, index=CONTROLS.index(current.mode), key="budgeter_mode")
low = form[1].number_input("Low band (fraction of pool)", value=float(current.low), step=0.01, format="%.2f",
                           key="budgeter_low")
high = form[2].number_input("High band (fraction of pool)", value=float(current.high), step=0.01, format="%.2f",
                            key="budgeter_high")

problem: str | None = None
result: pv.Preview | None = None
proposed: BudgeterConfig | None = None
try:
    proposed = current.replace(mode=mode, low=low, high=high)
except ConfigError as exc:
    problem = str(exc)

if problem:
    st.error(escape_md(f"Not valid, nothing can be sent: {problem} (need 0 < low < high <= 1)."))
else:
    assert proposed is not None
    try:
        result = pv.preview(state, sessions, proposed, now)
    except (ConfigError, ValueError, TypeError) as exc:
        result = None
        st.warning(escape_md(f"No preview: {exc}"))
    if result is not None:
        st.markdown("**Preview** (computed by `core.budgeter`, the sidecar's own code, on the sessions as of "
                    f"{age_text(age)})")
        pcols = st.columns(2)
        with pcols[0]:
            st.caption(f"Would park at their next turn boundary: {len(result.would_park)}")
            st.dataframe({"session": result.would_park}, hide_index=True, key="preview_park", width="stretch")
        with pcols[1]:
            st.caption(f"Would admit now: {len(result.would_admit)}")
            st.dataframe({"session": result.would_admit}, hide_index=True, key="preview_admit", width="stretch")
        if mode == "latency-park":
            st.caption("latency-park judges recent turn latencies, which the preview does not have: it parks nobody.")

changed = proposed is not None and (proposed.mode, proposed.low, proposed.high) != (current.mode, current.low,
                                                                                     current.high)
if st.button("Apply", key="budgeter_apply", type="primary", disabled=operator is None or problem is not None
             or not changed, help=signed_out_reason(settings) if operator is None else None):
    assert proposed is not None
    params = {k: v for k, v in (("mode", proposed.mode), ("low", proposed.low), ("high", proposed.high))
              if getattr(current, k) != v}
    effect = (f"Set engine {ref.key}'s budgeter to mode {proposed.mode}, bands {proposed.low:.2f}-{proposed.high:.2f}"
              f" (now {current.mode}, {current.low:.2f}-{current.high:.2f}).")
    if result is not None:
        effect += (f" Right now that would park {len(result.would_park)} session(s) at their next turn and admit "
                   f"{len(result.would_admit)}.")
    actions.request(actions.Action(kind="budgeter", effect=effect, engine=ref.key,
                                   sidecar_target_id=ref.sidecar_target_id, sidecar_url=ref.sidecar_url,
                                   sidecar_name=ref.sidecar_name, params=params))
    st.rerun()
if not changed and problem is None:
    st.caption("Change a value to apply it.")
