"""Overview (fleet): one row per engine with its state and signals, charts of every engine, live."""

from __future__ import annotations

import math
import time

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import charts, data
from dashboard import frames as q
from dashboard.settings import Settings
from dashboard.status import COLOR, age_text, collectors_alive, engine_status
from dashboard.ui import RANGES, ensure_router, escape_md, fmt_tokens, require_database

ensure_router()
settings = Settings.from_env()
st.title("Overview")
require_database(settings)
url = settings.database_url


def fleet_rows(engines: list[q.EngineRef], now: float) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    health = data.health(url)
    beats = data.heartbeats(url)
    last_beat = max((b["last_beat_ts"] for b in beats), default=None)
    alive = collectors_alive(last_beat, now, settings.heartbeat_stale_seconds)
    all_ids = tuple(sorted({t for e in engines for t in e.target_ids}))
    latest = data.latest(url, all_ids)
    states = data.sidecar_states(url)
    alerts = data.alerts(url, now - 86400)
    firing = alerts[alerts["state"] == "firing"] if not alerts.empty else alerts
    rows = []
    ranks: dict[str, pd.DataFrame] = {}
    for ref in engines:
        ids = set(ref.target_ids)
        rules = set(firing[firing["target_id"].isin(ids)]["rule"]) if not firing.empty else set()
        side = states.get(ref.sidecar_target_id or -1, {})
        status = engine_status(ref, health, now=now, stale_after=settings.stale_after_seconds, collectors_ok=alive,
                               collectors_age=None if last_beat is None else now - last_beat,
                               firing_rules=rules, regime=side.get("regime"))
        s_id, e_id = ref.sidecar_target_id, ref.engine_target_id
        demand = latest.value(s_id, "demand_tokens")
        pool = latest.value(s_id, "pool_tokens") or latest.summed(e_id, "pool_tokens")
        last_ok = max((health[t].last_success_ts or 0.0 for t in ref.target_ids if t in health), default=0.0)
        rows.append({
            "engine": ref.key,
            "state": status.badge,
            "R_t": latest.value(s_id, "token_weighted"),
            "R_r": latest.value(s_id, "request_weighted"),
            "D": latest.value(s_id, "divergence"),
            "demand / pool": f"{fmt_tokens(demand)} / {fmt_tokens(pool)}" + (
                f" ({demand / pool:.0%})" if demand is not None and pool else ""),
            "in system": latest.value(s_id, "sessions_in_system"),
            "parked": latest.value(s_id, "parked"),
            "turns/s": latest.value(s_id, "turns_per_s"),
            "KV usage": _mean(latest, e_id, "kv_usage"),
            "running": latest.summed(e_id, "requests_running"),
            "waiting": latest.summed(e_id, "requests_waiting"),
            "open alerts": len(rules),
            "last good scrape": age_text(now - last_ok) if last_ok else "never",
            "why": status.reason,
        })
        labels = [lab for lab in latest.labels(e_id) if lab]
        if len(labels) > 1:
            ranks[ref.key] = pd.DataFrame([{
                "rank": lab,
                "hit ratio": latest.value(e_id, "engine_hit_ratio", lab),
                "KV usage": latest.value(e_id, "kv_usage", lab),
                "running": latest.value(e_id, "requests_running", lab),
                "waiting": latest.value(e_id, "requests_waiting", lab),
                "pool tokens": latest.value(e_id, "pool_tokens", lab),
            } for lab in labels])
    return pd.DataFrame(rows), ranks


def _mean(latest: q.Latest, target_id: int | None, signal: str) -> float | None:
    vals = [latest.value(target_id, signal, lab) for lab in latest.labels(target_id)]
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


@st.fragment(run_every=settings.refresh_seconds)
def fleet_panel() -> None:
    now = time.time()
    try:
        engines = data.engines(url)
        if not engines:
            st.info("No engines recorded yet: the collectors have not scraped any target.")
            return
        table, ranks = fleet_rows(engines, now)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        return
    st.caption(f"As of {time.strftime('%H:%M:%S', time.gmtime(now))} UTC; refreshes every "
               f"{settings.refresh_seconds:g} s. State precedence: down > stale > collapsed > thin-reuse > healthy; "
               "numbers of a down or stale engine are its last known values (grey).")
    old = {"DOWN", "STALE"}
    styled = (table.style.map(lambda v: f"background-color: {COLOR.get(v, '')}", subset=["state"])
              .apply(lambda row: ["color: #9e9e9e; font-style: italic" if row["state"] in old and col not in
                                  ("engine", "state", "why", "last good scrape") else "" for col in row.index],
                     axis=1)
              .format({"R_t": "{:.2f}", "R_r": "{:.2f}", "D": "{:.2f}", "KV usage": "{:.0%}", "turns/s": "{:.2f}",
                       "in system": "{:.0f}", "parked": "{:.0f}", "running": "{:.0f}", "waiting": "{:.0f}"},
                      na_rep="-"))
    st.dataframe(styled, key="fleet_table", hide_index=True, width="stretch", column_config={
        "R_t": st.column_config.NumberColumn("R_t", format="%.2f", help="token-weighted hit rate (sidecar)"),
        "R_r": st.column_config.NumberColumn("R_r", format="%.2f", help="request-weighted hit rate (sidecar)"),
        "D": st.column_config.NumberColumn("D", format="%.2f", help="R_r - R_t"),
        "KV usage": st.column_config.NumberColumn("KV usage", format="percent",
                                                  help="engine gauge; does not count idle cached prefixes"),
        "turns/s": st.column_config.NumberColumn(format="%.2f"),
        "in system": st.column_config.NumberColumn(format="%d"),
        "parked": st.column_config.NumberColumn(format="%d"),
        "running": st.column_config.NumberColumn(format="%d"),
        "waiting": st.column_config.NumberColumn(format="%d"),
    })
    cols = st.columns(min(len(engines), 6))
    for i, ref in enumerate(engines):
        cols[i % len(cols)].page_link("pages/engine.py", label=f"Open engine {escape_md(ref.key)}",
                                      query_params={"engine": ref.key})
    for key, frame in ranks.items():
        with st.expander(f"Data-parallel ranks of engine {escape_md(key)} ({len(frame)})"):
            st.dataframe(frame, hide_index=True, key=f"ranks_{key}")


@st.fragment(run_every=settings.refresh_seconds)
def charts_panel(span: float) -> None:
    now = time.time()
    try:
        engines = data.engines(url)
        if not engines:
            return
        end = data.live_now(settings)
        start = end - span
        sidecars = {e.sidecar_target_id: e.key for e in engines if e.sidecar_target_id is not None}
        eng_ids = {e.engine_target_id: e.key for e in engines if e.engine_target_id is not None}
        frame = data.series(url, tuple(sorted(sidecars)), ("token_weighted", "request_weighted", "divergence",
                                                            "demand_fraction"), start, end)
        eframe = q.combine_ranks(data.series(url, tuple(sorted(eng_ids)), ("kv_usage", "requests_running",
                                                                         "requests_waiting"), start, end))
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        return
    max_gap = max(10.0, 3 * q.step_for_span(span))
    common = dict(start=start, end=end, now=now, stale_after=settings.stale_after_seconds, max_gap=max_gap)
    fig = charts.overview_figure(frame, sidecars, **common)
    st.plotly_chart(fig, key="overview_hit_rates", width="stretch")
    left, right = st.columns(2)
    with left:
        st.plotly_chart(_per_engine(frame, sidecars, "divergence", "D = R_r - R_t per engine (UTC)", "D",
                                    threshold=settings.divergence_threshold, y_range=(-0.1, 1.0), **common),
                        key="overview_divergence", width="stretch")
        st.plotly_chart(_per_engine(eframe, eng_ids, ("requests_running", "requests_waiting"),
                                    "Requests running (solid) and waiting (dashed) (UTC)", "requests", **common),
                        key="overview_requests", width="stretch")
    with right:
        st.plotly_chart(_per_engine(eframe, eng_ids, "kv_usage",
                                    "Engine KV usage gauge (UTC; excludes idle cached prefixes)", "fraction",
                                    y_range=(0, 1.05), **common),
                        key="overview_kv", width="stretch")
        # at least the pool and a margin, and always the whole line: demand past the pool is the collapse signal
        peak = 0.0 if frame.empty else float(frame.loc[frame["signal"] == "demand_fraction", "value"].max())
        peak = peak if math.isfinite(peak) else 0.0  # no demand samples in range: max() is NaN
        st.plotly_chart(_per_engine(frame, sidecars, "demand_fraction", "KV demand / pool per engine (UTC)",
                                    "fraction of pool", y_range=(0, max(1.2, 1.05 * peak)), threshold=1.0,
                                    threshold_label="KV pool", **common),
                        key="overview_demand", width="stretch")


def _per_engine(frame: pd.DataFrame, names: dict[int, str], signals: str | tuple[str, ...], title: str,
                y_title: str, *, start: float, end: float, now: float, stale_after: float, max_gap: float,
                threshold: float | None = None, threshold_label: str | None = None,
                y_range: tuple[float, float] | None = None) -> go.Figure:
    palette = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    sigs = (signals,) if isinstance(signals, str) else signals
    fig = go.Figure()
    for i, (target_id, name) in enumerate(names.items()):
        part = frame[frame["target_id"] == target_id]
        for j, signal in enumerate(sigs):
            label = name if len(sigs) == 1 else f"{name} {charts.LABELS.get(signal, signal)}"
            trace = charts.signal_line(part, signal, max_gap=max_gap, name=label,
                                       color=palette[i % len(palette)], dash="dash" if j else None)
            if trace is not None:
                fig.add_trace(trace)
    if threshold is not None:
        fig.add_hline(y=threshold, line=dict(color="#d62728", dash="dash", width=1),
                      annotation_text=threshold_label or f"threshold {threshold:g}", annotation_position="top left")
    fig.update_yaxes(title_text=y_title, range=list(y_range) if y_range else None, rangemode="tozero")
    charts.add_staleness(fig, None if frame.empty else float(frame["ts"].max()), now, stale_after)
    fig.update_layout(**{**charts.BASE_LAYOUT, "height": 280}, title=dict(text=title, font=dict(size=14)))
    fig.update_xaxes(range=[charts.to_time(start), charts.to_time(end)])
    return fig


fleet_panel()
st.subheader("Charts")
range_labels = ["15m", "1h", "6h", "24h"]
chosen = st.query_params.get("range", "15m")
span_label = st.segmented_control("Time range", range_labels, default=chosen if chosen in range_labels else "15m",
                                  key="overview_range") or "15m"
charts_panel(RANGES[span_label])
