"""Engine: one engine's reuse, KV demand, backlog, the vLLM panels (latency, tokens/s, preemptions), with what
operators and policies did; live, paused, a custom range, or "at that moment" from an alert link."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dashboard import asof, charts, data, engine_view, live, misses
from dashboard import frames as q
from dashboard import risk as risk_view
from dashboard.settings import Settings
from dashboard.timerange import TimeWindow, time_control
from dashboard.ui import choose_engine, ensure_router, escape_md, max_gap_for, require_database

ensure_router()
settings = Settings.from_env()
url = settings.database_url
st.title("Engine")
require_database(settings)

try:
    engines = data.engines(url)
except data.DatabaseUnavailable as exc:
    st.error(str(exc))
    st.stop()
ref = choose_engine(engines)
window = time_control(settings, key="engine")
if ref is None:
    st.stop()


def engine_frames(ref: q.EngineRef, w: TimeWindow) -> tuple[pd.DataFrame, pd.DataFrame]:
    side = pd.DataFrame(columns=["ts", "target_id", "engine_label", "signal", "value"])
    eng = side
    if ref.sidecar_target_id is not None:
        side = data.series(url, (ref.sidecar_target_id,), engine_view.SIDECAR_SIGNALS, w.start, w.end)
    if ref.engine_target_id is not None:
        eng = q.combine_ranks(
            data.series(url, (ref.engine_target_id,), engine_view.ENGINE_SIGNALS, w.start, w.end)
        )
    return side, eng


def render(ref: q.EngineRef, w: TimeWindow) -> None:
    now = time.time()
    try:
        side, eng = engine_frames(ref, w)
        events = data.events(url, ref, w.start, w.end)
        health = data.health(url)
        if w.live:
            engine_view.live_status(settings, ref, now)
        else:  # the link's moment, or the end of a paused or custom window: the state stored for then
            at = asof.moment(w) or w.end
            alerts = data.alerts(url, at - 7 * 86400, at)
            engine_view.status_at(ref, at, side, eng, alerts)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        return
    side = engine_view.drop_frozen_reuse(side, ref, health, live=w.at is None)
    frame = pd.concat([side, eng], ignore_index=True)
    common = dict(
        start=w.start,
        end=w.end,
        now=min(now, w.end),
        # a bucketed point is stamped with its bucket's start: its newest sample may be a bucket later
        stale_after=settings.stale_after_seconds + q.step_for_span(w.end - w.start),
        max_gap=max_gap_for(w),
    )
    if ref.sidecar_target_id is None:
        st.warning(
            "No sidecar fronts this engine: R_r, D, demand and backlog are unknown (the dotted line is "
            "the engine's own token hit ratio)."
        )
    figures = engine_view.figures(frame, eng, events, settings, common)
    for fig in figures.values():
        if w.at is not None:
            charts.mark_moment(fig, w.at, "alert time" if st.query_params.get("alert") else "the moment")
    st.plotly_chart(figures["hit"], key="engine_hit_rates", width="stretch")
    risk_view.render_timeline(url, ref, w.start, w.end, common["max_gap"])
    left, right = st.columns(2)
    with left:
        gauges = st.columns(2)
        demand = engine_view.last_value(side, "demand_fraction", w.at)
        usage = engine_view.last_value(eng, "kv_usage", w.at)
        gauges[0].metric(
            "KV demand / pool (sidecar)",
            "-" if demand is None else f"{demand:.0%}",
            help="sum over admitted sessions of context + output budget, over the engine's KV pool",
        )
        gauges[1].metric(
            "Engine KV usage gauge",
            "-" if usage is None else f"{usage:.0%}",
            help="the engine's own gauge: idle sessions' cached prefixes count as free",
        )
        st.plotly_chart(figures["kv"], key="engine_kv", width="stretch")
        st.caption(
            "The engine's KV usage gauge (dotted) counts blocks of running requests only: idle sessions' "
            "cached prefixes count as free, so it does not show cache residency. Demand is the sidecar's sum over admitted sessions of context + "
            "output budget; the bands are drawn across the whole range."
        )
    with right:
        st.plotly_chart(figures["backlog"], key="engine_backlog", width="stretch")
        if "admission" in figures:
            st.plotly_chart(figures["admission"], key="engine_admission", width="stretch")
        st.plotly_chart(figures["cost"], key="engine_cost", width="stretch")
        st.caption(
            f"Cached prompt tokens priced at {settings.cached_token_price:g} of an uncached token "
            "(PREFIXOPS_CACHED_TOKEN_PRICE)."
        )
    st.subheader("Why prompt tokens were missed")
    misses.engine_panel(url, ref, w.start, w.end)
    st.subheader("Serving (the vLLM dashboard's panels)")
    cols = st.columns(2)
    for i, name in enumerate(engine_view.SERVING_PANELS):
        if name in figures:
            with cols[i % 2]:
                st.plotly_chart(figures[name], key=f"engine_{name}", width="stretch")
    missing = engine_view.missing_serving_signals(eng)
    if missing:
        st.caption(
            "Not reported by this engine (or not collected yet): " + escape_md(", ".join(missing)) + "."
        )
    engine_view.per_model_table(url, ref, w)
    st.subheader("What happened in this window")
    if events.empty:
        st.caption("No operator actions, compaction decisions or alerts in this window.")
    else:
        shown = events.sort_values("ts", ascending=False).drop(columns=["label"]).copy()
        shown.insert(0, "time (UTC)", [charts.to_time(t).strftime("%Y-%m-%d %H:%M:%S") for t in shown["ts"]])
        st.dataframe(shown.drop(columns="ts"), hide_index=True, key="engine_events", width="stretch")


def engine_panel() -> None:
    render(ref, window.moving(data.live_now(settings)))


live.live_panel("engine", settings, window.live, engine_panel)
