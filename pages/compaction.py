"""Compaction: thin-reuse state and D, subtrees by warmth, the gate's recent decisions; defer or lift."""

from __future__ import annotations

import time

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import actions, asof, charts, data, live
from dashboard.auth import current_operator, signed_out_reason
from dashboard.status import age_text, last_hit_text
from dashboard.timerange import time_control
from dashboard.ui import escape_md, fmt_ts, max_gap_for, open_sidecar_page

settings, ref = open_sidecar_page("Compaction", "there is no compaction gate to show or control.")
url = settings.database_url
sidecar_id = ref.sidecar_target_id
window = time_control(settings, key="compaction")


def gate_panel() -> None:
    now = time.time()
    w = window.moving(data.live_now(settings))
    start, end = w.start, w.end
    at = asof.moment(w)
    try:
        side = data.sidecar_states(url).get(sidecar_id)
        then = (
            None
            if at is None
            else data.latest(
                url, (sidecar_id,), ("divergence", "token_weighted", "request_weighted", "thin_reuse"), at
            )
        )
        frame = data.series(
            url, (sidecar_id,), ("divergence", "token_weighted", "request_weighted"), start, end
        )
        subtrees = data.subtrees(url, (sidecar_id,))
        decisions = data.decisions(url, (sidecar_id,), start, end)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        return
    state = side["state"] if side and isinstance(side.get("state"), dict) else {}
    reuse = dict(state.get("reuse") or {})
    comp = state.get("compaction") or {}
    if then is not None:  # paused: R_t, R_r, D and the regime as of `at`, from the stored samples
        for name in ("divergence", "token_weighted", "request_weighted"):
            reuse[name] = then.value(sidecar_id, name)
        regime_then = asof.sidecar_states_at(then, (sidecar_id,)).get(sidecar_id, {})
        reuse["regime"] = regime_then.get("regime")
        newest = max((ts for ts, _v in then.values.values()), default=None)
        if newest is None:
            st.warning(f"No samples of this sidecar stored at or before {fmt_ts(at)}.")
        elif at - newest > settings.stale_after_seconds:
            st.warning(f"At {fmt_ts(at)} the sidecar's newest samples were {age_text(at - newest)}.")
    elif side is None:
        st.warning("The collectors have not recorded this sidecar's /state yet.")
    else:
        age = now - side["ts"]
        if age > settings.stale_after_seconds:
            st.warning(f"The sidecar's state is {age_text(age)}: what follows may no longer be true.")
    cols = st.columns(4)
    regime = reuse.get("regime") or ((side or {}).get("regime") if then is None else None) or "unknown"
    cols[0].metric("Regime", str(regime))
    d = reuse.get("divergence")
    cols[1].metric(
        "D = R_r - R_t",
        "-" if d is None else f"{d:.2f}",
        help=escape_md(
            f"enter thin-reuse above {reuse.get('regime_enter', settings.divergence_threshold)}, "
            f"leave below {reuse.get('regime_exit', '?')}"
        ),
    )
    cols[2].metric("R_t / R_r", f"{_f(reuse.get('token_weighted'))} / {_f(reuse.get('request_weighted'))}")
    deferred_until = comp.get("deferred_until")
    deferral = "Operator deferral" if at is None else "Operator deferral (now)"  # the help says: not then
    if deferred_until and deferred_until > now:
        cols[3].metric(
            deferral,
            f"until {fmt_ts(deferred_until)[11:19]}",
            help="compaction is deferred by an operator"
            + ("" if at is None else "; " + asof.now_only("the deferral", at)),
        )
        who = comp.get("deferred_by")
        why = comp.get("deferred_reason")
        st.text(
            ("" if at is None else f"N{asof.now_label(at)[1:]}: ")
            + f"Deferred by {who or 'an operator'} until {fmt_ts(deferred_until)}"
            + (f": {why}" if why else "")
            + f" ({(deferred_until - now) / 60:.0f} min left)."
        )
    else:
        cols[3].metric(deferral, "none", help=None if at is None else asof.now_only("the deferral", at))
    if at is not None:
        st.caption(
            f"Paused: regime, D and R_t / R_r are the sidecar's samples at or before {fmt_ts(at)}; "
            + asof.now_only("the operator deferral and the subtrees below", at)
        )
    fig = go.Figure()
    trace = charts.signal_line(frame, "divergence", max_gap=max_gap_for(w))
    if trace is not None:
        fig.add_trace(trace)
    threshold = float(reuse.get("regime_enter") or settings.divergence_threshold)
    fig.add_hrect(y0=threshold, y1=1.0, fillcolor="#d62728", opacity=0.08, line_width=0)
    fig.add_hline(
        y=threshold,
        line=dict(color="#d62728", dash="dash", width=1),
        annotation_text=f"thin-reuse threshold {threshold:g}",
        annotation_position="top left",
    )
    if not decisions.empty:
        events = pd.DataFrame(
            {
                "ts": decisions["ts"],
                "kind": "compaction",
                "text": [
                    f"{dec} {sub}: {why}"
                    for dec, sub, why in zip(
                        decisions["decision"], decisions["subtree_id"], decisions["reason"], strict=True
                    )
                ],
            }
        )
        charts.add_events(fig, events, y=1.0)
    charts.add_staleness(
        fig, None if frame.empty else float(frame["ts"].max()), min(now, end), settings.stale_after_seconds
    )
    fig.update_yaxes(range=[-0.1, 1.05], title_text="D")
    fig.update_layout(
        **{**charts.BASE_LAYOUT, "height": 260},
        title=dict(text="D with the gate's decisions (UTC)", font=dict(size=14)),
    )
    fig.update_xaxes(range=[charts.to_time(start), charts.to_time(end)])
    st.plotly_chart(fig, key="compaction_divergence", width="stretch")

    st.subheader("Subtrees by warmth (hot first)" + ("" if at is None else f", {asof.now_label(at)}"))
    if subtrees.empty:
        st.caption("No shared prefixes reported by this sidecar.")
    else:
        shown = pd.DataFrame(
            {
                "subtree": subtrees["subtree_id"].astype(str),
                "recent hits": subtrees["recent_hits"],
                "warm": subtrees["warm"].fillna(False).astype(bool),
                "pinned (top-K)": subtrees["pinned"].fillna(False).astype(bool),
                # no sidecar reports a subtree's length today (GET /subtrees): say so rather than "None"
                "tokens": ["not reported" if pd.isna(t) else f"{int(t):,}" for t in subtrees["tokens"]],
                "last hit": [last_hit_text(t, now) for t in subtrees["last_hit_ts"]],
            }
        )
        st.dataframe(shown, hide_index=True, width="stretch", key="compaction_subtrees")
    st.subheader("Gate decisions in the time range (newest first)")
    if decisions.empty:
        st.caption("No compaction requests in the time range.")
    else:
        shown = pd.DataFrame(
            {
                "time (UTC)": [fmt_ts(t) for t in decisions["ts"]],
                "subtree": decisions["subtree_id"].astype(str),
                "decision": decisions["decision"],
                "reason": decisions["reason"],
                "D": decisions["divergence"],
            }
        )
        st.dataframe(shown, hide_index=True, width="stretch", key="compaction_decisions")


def _f(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "-"


live.live_panel("compaction", settings, window.live, gate_panel)

st.subheader("Defer or allow")
operator = current_operator(settings)
if operator is None:
    st.info(signed_out_reason(settings))
row = st.columns([2, 4, 2, 2])
minutes = row[0].selectbox(
    "Defer for",
    [15, 30, 60, 120, 240, 480, 1440],
    index=2,
    key="defer_minutes",
    format_func=lambda m: f"{m} min" if m < 60 else f"{m // 60} h",
    disabled=operator is None,
)
reason = row[1].text_input(
    "Reason (recorded in the audit)", key="defer_reason", max_chars=200, disabled=operator is None
)
help_text = signed_out_reason(settings) if operator is None else None
if row[2].button("Defer compaction", key="defer_compaction", disabled=operator is None, help=help_text):
    actions.request(
        actions.Action(
            kind="defer",
            engine=ref.key,
            sidecar_target_id=sidecar_id,
            sidecar_url=ref.sidecar_url,
            sidecar_name=ref.sidecar_name,
            params={"minutes": minutes, **({"reason": reason} if reason else {})},
            effect=(
                f"Defer every compaction on engine {ref.key} for {minutes} minutes: the gate refuses compaction "
                f"requests until then, whatever the reuse."
            ),
        )
    )
    st.rerun()
if row[3].button("Lift deferral", key="allow_compaction", disabled=operator is None, help=help_text):
    actions.request(
        actions.Action(
            kind="allow",
            engine=ref.key,
            sidecar_target_id=sidecar_id,
            sidecar_url=ref.sidecar_url,
            sidecar_name=ref.sidecar_name,
            effect=(
                f"Lift the operator deferral on engine {ref.key}: the gate decides again from warmth and D "
                "(it still defers while the thin-reuse regime lasts)."
            ),
        )
    )
    st.rerun()
st.caption(
    escape_md(
        "The gate itself (token-weighted reuse and warmth, never request counts) runs in the sidecar; "
        "this page shows its decisions and can only add or lift an operator deferral."
    )
)
