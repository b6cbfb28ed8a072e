"""Budgeter: mode, bands and pool; change them, validated, with a preview from the sidecar's own policy code."""

from __future__ import annotations

import time

import streamlit as st

from core.budgeter import CONTROLS, BudgeterConfig, ConfigError
from dashboard import actions, data, forecast_view
from dashboard import preview as pv
from dashboard.auth import current_operator, signed_out_reason
from dashboard.status import age_text
from dashboard.ui import escape_md, fmt_tokens, fmt_ts, open_sidecar_page

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
full_state = side["state"]
fresh = actions.read_back_state(ref.sidecar_url, side["ts"])
if fresh is not None:
    full_state = fresh
    st.caption(
        "Showing the sidecar's state read back right after your change (the collectors' next scrape "
        "has not stored it yet)."
    )
state = full_state.get("budgeter") or {}
age = 0.0 if fresh is not None else now - side["ts"]
if age > settings.stale_after_seconds:
    st.warning(f"The sidecar's state is {age_text(age)}: what follows may no longer be true.")

try:
    current = pv.current_config(state)
except ConfigError as exc:
    st.error(escape_md(f"The sidecar reports a budgeter config this dashboard cannot read: {exc}"))
    st.stop()
pool = state.get("pool_tokens")
demand = state.get("demand_tokens")
# The mode has a row of its own: a metric's value is never wrapped, and the longest mode ("session-cap-park")
# in a fifth of the page was cut to "budgeter…". Demand is a fraction of the pool, like the bands beside it.
st.metric("Mode", current.mode, help="the budgeter's control mode at the sidecar")
cols = st.columns(4)
cols[0].metric("Low band", f"{current.low:.2f}", help="admit new or parked sessions while demand is below")
cols[1].metric("High band", f"{current.high:.2f}", help="park at turn boundaries while demand is above")
cols[2].metric(
    "Demand / pool",
    "-" if demand is None or not pool else f"{demand / pool:.2f}",
    help=escape_md(f"KV demand of the admitted sessions: {fmt_tokens(demand)} tokens of {fmt_tokens(pool)}"),
)
cols[3].metric(
    "KV pool", fmt_tokens(pool), help=escape_md(f"source: {state.get('pool_source') or 'unknown'}")
)
if pool is None:
    st.warning(
        "The KV pool size is unknown: the budgeter cannot act on token bands (see the sidecar's warnings "
        "on the Engine page)."
    )
backlog = full_state.get("backlog") or {}
st.caption(
    escape_md(
        f"As of {age_text(age)}: {backlog.get('admitted', '?')} admitted, {backlog.get('parked', '?')} "
        f"parked, {backlog.get('waiting', '?')} waiting."
    )
)

st.subheader("Change mode and bands")
operator = current_operator(settings)
if operator is None:
    st.info(signed_out_reason(settings))
form = st.columns(3)
mode = form[0].selectbox("Mode", CONTROLS, index=CONTROLS.index(current.mode), key="budgeter_mode")
low = form[1].number_input(
    "Low band (fraction of pool)", value=float(current.low), step=0.01, format="%.2f", key="budgeter_low"
)
high = form[2].number_input(
    "High band (fraction of pool)", value=float(current.high), step=0.01, format="%.2f", key="budgeter_high"
)

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
        st.markdown(
            "**Preview** (computed by `core.budgeter`, the sidecar's own code, on the sessions as of "
            f"{age_text(age)})"
        )
        pcols = st.columns(2)
        with pcols[0]:
            st.caption(f"Would park at their next turn boundary: {len(result.would_park)}")
            st.dataframe({"session": result.would_park}, hide_index=True, key="preview_park", width="stretch")
        with pcols[1]:
            st.caption(f"Would admit now: {len(result.would_admit)}")
            st.dataframe(
                {"session": result.would_admit}, hide_index=True, key="preview_admit", width="stretch"
            )
        if mode == "latency-park":
            st.caption(
                "latency-park judges recent turn latencies, which the preview does not have: it parks nobody."
            )

forecast_view.section(settings, ref, state, sessions, current, proposed, now, backlog=backlog)

changed = proposed is not None and (proposed.mode, proposed.low, proposed.high) != (
    current.mode,
    current.low,
    current.high,
)
if st.button(
    "Apply",
    key="budgeter_apply",
    type="primary",
    disabled=operator is None or problem is not None or not changed,
    help=signed_out_reason(settings) if operator is None else None,
):
    assert proposed is not None
    params = {
        k: v
        for k, v in (("mode", proposed.mode), ("low", proposed.low), ("high", proposed.high))
        if getattr(current, k) != v
    }
    effect = (
        f"Set engine {ref.key}'s budgeter to mode {proposed.mode}, bands {proposed.low:.2f}-{proposed.high:.2f}"
        f" (now {current.mode}, {current.low:.2f}-{current.high:.2f})."
    )
    if result is not None:
        effect += (
            f" Right now that would park {len(result.would_park)} session(s) at their next turn and admit "
            f"{len(result.would_admit)}."
        )
    actions.request(
        actions.Action(
            kind="budgeter",
            effect=effect,
            engine=ref.key,
            sidecar_target_id=ref.sidecar_target_id,
            sidecar_url=ref.sidecar_url,
            sidecar_name=ref.sidecar_name,
            params=params,
        )
    )
    st.rerun()
if not changed and problem is None:
    st.caption("Change a value to apply it.")


def last_change() -> dict | None:
    """The newest budgeter change on this sidecar with its settings before it (from the audit)."""
    try:
        frame = data.audit_for(url, (ref.sidecar_target_id,), now - 30 * 86400, now + 60)
    except data.DatabaseUnavailable:
        return None
    for row in frame.itertuples():
        if row.action in ("budgeter.update", "budgeter") and isinstance(row.before, dict):
            return {"ts": row.ts, "actor": row.actor, "before": row.before, "after": row.after}
    return None


st.subheader("Undo the last change")
change = last_change()
if change is None:
    st.caption("No budgeter change of this sidecar in the audit (last 30 days).")
else:
    before = {
        k: change["before"].get(k) for k in ("mode", "low", "high") if change["before"].get(k) is not None
    }
    now_cfg = {"mode": current.mode, "low": current.low, "high": current.high}
    undo = {k: v for k, v in before.items() if now_cfg.get(k) != v}
    st.text(
        f"{change['actor'] or '?'} at {fmt_ts(change['ts'])}: "
        + ", ".join(
            f"{k} {change['before'].get(k)} -> {(change['after'] or {}).get(k)}"
            for k in ("mode", "low", "high")
            if change["before"].get(k) != (change["after"] or {}).get(k)
        )
    )
    if st.button(
        "Undo: set " + (", ".join(f"{k} {v}" for k, v in undo.items()) or "nothing (already as before)"),
        key="budgeter_undo",
        disabled=operator is None or not undo,
        help=signed_out_reason(settings) if operator is None else None,
    ):
        actions.request(
            actions.Action(
                kind="budgeter",
                engine=ref.key,
                sidecar_target_id=ref.sidecar_target_id,
                sidecar_url=ref.sidecar_url,
                sidecar_name=ref.sidecar_name,
                params={**undo, "undo_of": f"{change['actor']}@{change['ts']:.0f}"},
                effect=(
                    f"Undo {change['actor']}'s budgeter change of {fmt_ts(change['ts'])} on engine {ref.key}: set "
                    + ", ".join(f"{k} {v}" for k, v in undo.items())
                    + " again. Recorded in the audit as an undo."
                ),
            )
        )
        st.rerun()
