"""Engine: one engine's reuse, KV demand, backlog, latency and cost, with what operators and policies did."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dashboard import charts, data
from dashboard import frames as q
from dashboard.settings import Settings
from dashboard.status import age_text, collectors_alive, engine_status
from dashboard.ui import (
    TimeWindow,
    back_to_live_button,
    choose_engine,
    choose_range,
    ensure_router,
    escape_md,
    fmt_ts,
    max_gap_for,
    require_database,
)

ensure_router()
settings = Settings.from_env()
url = settings.database_url
st.title("Engine")
require_database(settings)

SIDECAR_SIGNALS = ("token_weighted", "request_weighted", "divergence", "demand_fraction", "band_low", "band_high",
                   "admitted", "parked", "waiting", "turns_per_s")
ENGINE_SIGNALS = ("engine_hit_ratio", "kv_usage", "ttft_p50", "ttft_p90", "ttft_p99", "prompt_tokens_per_s",
                  "cached_tokens_per_s", "prefix_cache_hits_per_s", "prefix_cache_queries_per_s")

try:
    engines = data.engines(url)
except data.DatabaseUnavailable as exc:
    st.error(str(exc))
    st.stop()
top = st.columns([2, 2, 3])
with top[0]:
    ref = choose_engine(engines)
with top[1]:
    window = choose_range(settings, default="1h")
if ref is None:
    st.stop()
back_to_live_button(window)


def engine_frames(ref: q.EngineRef, start: float, end: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    side = pd.DataFrame(columns=["ts", "target_id", "engine_label", "signal", "value"])
    eng = side
    if ref.sidecar_target_id is not None:
        side = data.series(url, (ref.sidecar_target_id,), SIDECAR_SIGNALS, start, end)
    if ref.engine_target_id is not None:
        eng = q.combine_ranks(data.series(url, (ref.engine_target_id,), ENGINE_SIGNALS, start, end))
    return side, eng


def status_line(ref: q.EngineRef, now: float) -> None:
    health = data.health(url)
    beats = data.heartbeats(url)
    last_beat = max((b["last_beat_ts"] for b in beats), default=None)
    alerts = data.alerts(url, now - 86400)
    firing = alerts[(alerts["state"] == "firing") & alerts["target_id"].isin(ref.target_ids)] \
        if not alerts.empty else alerts
    side = data.sidecar_states(url).get(ref.sidecar_target_id or -1, {})
    status = engine_status(ref, health, now=now, stale_after=settings.stale_after_seconds,
                           collectors_ok=collectors_alive(last_beat, now, settings.heartbeat_stale_seconds),
                           collectors_age=None if last_beat is None else now - last_beat,
                           firing_rules=set(firing["rule"]) if not firing.empty else set(),
                           regime=side.get("regime"))
    box = {"down": st.error, "stale": st.warning, "collapsed": st.error, "thin-reuse": st.warning}.get(
        status.state, st.success)
    box(escape_md(f"{status.badge}: {status.reason}"))
    facts = []
    for tid in ref.target_ids:
        h = health.get(tid)
        if h:
            facts.append(f"{h.role} {h.name} ({h.url}): {'up' if h.up else 'DOWN'}, last good scrape "
                         f"{age_text(now - h.last_success_ts) if h.last_success_ts else 'never'}")
    if side:
        budgeter = side["state"].get("budgeter", {}) if isinstance(side.get("state"), dict) else {}
        facts.append(f"sidecar state as of {fmt_ts(side['ts'])}: regime {side.get('regime')}, budgeter "
                     f"{budgeter.get('mode')} bands {budgeter.get('low')}-{budgeter.get('high')}, compaction "
                     + (f"deferred until {fmt_ts(side['compaction_deferred_until'])}"
                        if side.get("compaction_deferred_until") and side["compaction_deferred_until"] > now
                        else "not deferred"))
        for warning in side.get("warnings") or []:
            facts.append(f"sidecar warning: {warning}")
    if not firing.empty:
        for row in firing.itertuples():
            facts.append(f"firing since {fmt_ts(row.started_ts)}: {row.rule} ({row.severity}) {row.summary}")
    st.text("\n".join(facts))


def render(ref: q.EngineRef) -> None:
    now = time.time()
    w = choose_window_now()
    try:
        status_line(ref, now)
        side, eng = engine_frames(ref, w.start, w.end)
        events = data.events(url, ref, w.start, w.end)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        return
    frame = pd.concat([side, eng], ignore_index=True)
    common = dict(start=w.start, end=w.end, now=now, stale_after=settings.stale_after_seconds,
                  max_gap=max_gap_for(w))
    if ref.sidecar_target_id is None:
        st.warning("No sidecar fronts this engine: R_r, D, demand and backlog are unknown (the dotted line is "
                   "the engine's own token hit ratio).")
    st.plotly_chart(charts.hit_rate_figure(frame, events, threshold=settings.divergence_threshold, **common),
                    key="engine_hit_rates", width="stretch")
    left, right = st.columns(2)
    with left:
        gauges = st.columns(2)
        demand = _last(side, "demand_fraction")
        usage = _last(eng, "kv_usage")
        gauges[0].metric("KV demand / pool (sidecar)", "-" if demand is None else f"{demand:.0%}",
                         help="sum over admitted sessions of context + output budget, over the engine's KV pool")
        gauges[1].metric("Engine KV usage gauge", "-" if usage is None else f"{usage:.0%}",
                         help="the engine's own gauge: idle sessions' cached prefixes count as free")
        st.plotly_chart(charts.kv_figure(frame, events, **common), key="engine_kv", width="stretch")
        st.caption("The engine's KV usage gauge (dotted) counts blocks of running requests only: idle sessions' "
                   "cached prefixes count as free, so it does not show cache residency. Demand is the sidecar's "
                   "sum over admitted sessions of context + output budget.")
        st.plotly_chart(charts.lines_figure(frame, ("ttft_p50", "ttft_p90", "ttft_p99"), events,
                                            title="Time to first token (UTC)", y_title="seconds", **common),
                        key="engine_ttft", width="stretch")
    with right:
        st.plotly_chart(charts.backlog_figure(frame, events, **common), key="engine_backlog", width="stretch")
        cost = charts.relative_cost_frame(eng, settings.cached_token_price)
        st.plotly_chart(charts.lines_figure(cost, ("relative_cost",), events,
                                            title="Relative input cost (1 = no cache) (UTC)",
                                            y_title="cost / uncached cost", y_range=(0, 1.05), **common),
                        key="engine_cost", width="stretch")
        st.caption(f"Cached prompt tokens priced at {settings.cached_token_price:g} of an uncached token "
                   "(PREFIXOPS_CACHED_TOKEN_PRICE).")
    st.subheader("What happened in this window")
    if events.empty:
        st.caption("No operator actions, compaction decisions or alerts in this window.")
    else:
        shown = events.sort_values("ts", ascending=False).copy()
        shown.insert(0, "time (UTC)", [fmt_ts(t) for t in shown["ts"]])
        st.dataframe(shown.drop(columns="ts"), hide_index=True, key="engine_events", width="stretch")


def _last(frame: pd.DataFrame, signal: str) -> float | None:
    part = frame[frame["signal"] == signal]
    return None if part.empty else float(part.sort_values("ts")["value"].iloc[-1])


def choose_window_now() -> TimeWindow:
    """The window, re-evaluated at each fragment run so a live view moves with time."""
    if window.live:
        end = data.live_now(settings)
        return TimeWindow(end - window.span, end, window.label, None)
    return window


@st.fragment(run_every=settings.refresh_seconds if window.live else None)
def live_panel() -> None:
    render(ref)


live_panel()
