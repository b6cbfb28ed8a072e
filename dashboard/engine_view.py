"""The Engine page's pieces: its status (live, or *at* a moment from a link), its figures, and the
serving panels operators expect of a vLLM dashboard.

At a moment (``?at=``), the status is rebuilt from what was stored for that time: the engine's and the
sidecar's ``up`` samples, the sidecar's reuse and queue samples, and the alerts firing then. The live
banner and the sidecar's current warnings are not shown: they belong to now, not to that moment.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import asof, charts, data
from dashboard import frames as q
from dashboard.settings import Settings
from dashboard.status import BADGE, NEXT_STEP, Queue, age_text, collectors_alive, duration_text, engine_status
from dashboard.timerange import TimeWindow
from dashboard.ui import admission_wait_limit, escape_md, fmt_ts

SIDECAR_SIGNALS = (
    "token_weighted",
    "request_weighted",
    "divergence",
    "demand_fraction",
    "band_low",
    "band_high",
    "admitted",
    "parked",
    "waiting",
    "turns_per_s",
    "thin_reuse",
    "oldest_waiting_s",
    "oldest_parked_s",
    "up",
    "time_to_admit_p50",
    "time_to_admit_p95",
    "park_time_p50",
    "park_time_p95",
)
SERVING = {
    "ttft": (("ttft_p50", "ttft_p90", "ttft_p99"), "Time to first token (UTC)", "seconds"),
    "e2e": (("e2e_p50", "e2e_p90", "e2e_p99"), "End-to-end request latency (UTC)", "seconds"),
    "itl": (("itl_p50", "itl_p90", "itl_p99"), "Inter-token latency (UTC)", "seconds"),
    "queue": (
        ("queue_time_p50", "queue_time_p90", "queue_time_p99"),
        "Queue time in the engine (UTC)",
        "seconds",
    ),
    "tokens": (
        ("prompt_tokens_per_s", "generation_tokens_per_s"),
        "Prompt and generation tokens/s (UTC)",
        "tokens/s",
    ),
    "preemptions": (("preemptions_per_s",), "Preemptions per second (UTC; a collapse signal)", "per s"),
    "prompt_len": (
        ("prompt_len_p50", "prompt_len_p90", "prompt_len_p99"),
        "Prompt length distribution (UTC)",
        "tokens",
    ),
    "output_len": (
        ("output_len_p50", "output_len_p90", "output_len_p99"),
        "Output length distribution (UTC)",
        "tokens",
    ),
}
SERVING_PANELS = tuple(SERVING)
ENGINE_SIGNALS = (
    "engine_hit_ratio",
    "kv_usage",
    "cached_tokens_per_s",
    "prefix_cache_hits_per_s",
    "prefix_cache_queries_per_s",
    "up",
    *dict.fromkeys(s for sigs, _t, _y in SERVING.values() for s in sigs),
)
REUSE_SIGNALS = (
    "token_weighted",
    "request_weighted",
    "divergence",
)  # computed from turns the engine completes
BOX = {
    "down": st.error,
    "stale": st.warning,
    "collapsed": st.error,
    "queueing": st.warning,
    "thin-reuse": st.warning,
}


def last_value(frame: pd.DataFrame, signal: str, at: float | None = None) -> float | None:
    part = frame[frame["signal"] == signal]
    if at is not None:
        part = part[part["ts"] <= at]
    if part.empty:
        return None
    value = float(part.sort_values("ts")["value"].iloc[-1])
    return value if math.isfinite(value) else None


def drop_frozen_reuse(
    side: pd.DataFrame, ref: q.EngineRef, health: dict[int, q.TargetHealth], *, live: bool
) -> pd.DataFrame:
    """While the engine does not answer, the sidecar's R_t/R_r/D stay at their last value (no turn
    completes): leave those points out after the engine's last good scrape, so the chart shades them stale.
    The queue stays (users piling up at the sidecar is exactly what to see)."""
    h = health.get(ref.engine_target_id) if ref.engine_target_id is not None else None
    if not live or h is None or h.up or side.empty:
        return side
    cutoff = h.last_success_ts or 0.0
    return side[~(side["signal"].isin(REUSE_SIGNALS) & (side["ts"] > cutoff))]


def live_status(settings: Settings, ref: q.EngineRef, now: float) -> None:
    url = settings.database_url
    health = data.health(url)
    beats = data.heartbeats(url)
    last_beat = max((b["last_beat_ts"] for b in beats), default=None)
    alerts = data.alerts(url, now - 86400)
    firing = (
        alerts[(alerts["state"] == "firing") & alerts["target_id"].isin(ref.target_ids)]
        if not alerts.empty
        else alerts
    )
    side = data.sidecar_states(url).get(ref.sidecar_target_id or -1, {})
    state = side.get("state") if isinstance(side.get("state"), dict) else {}
    backlog, reuse = state.get("backlog") or {}, state.get("reuse") or {}
    queue = Queue(backlog.get("waiting"), backlog.get("oldest_waiting_s"), backlog.get("oldest_parked_s"))
    status = engine_status(
        ref,
        health,
        now=now,
        stale_after=settings.stale_after_seconds,
        collectors_ok=collectors_alive(last_beat, now, settings.heartbeat_stale_seconds),
        collectors_age=None if last_beat is None else now - last_beat,
        firing_rules=set(firing["rule"]) if not firing.empty else set(),
        regime=side.get("regime"),
        divergence=reuse.get("divergence"),
        queue=queue if ref.sidecar_target_id else None,
        admission_wait_s=admission_wait_limit(),
    )
    BOX.get(status.state, st.success)(escape_md(f"{status.badge}: {status.why}"))
    facts = []
    for tid in ref.target_ids:
        h = health.get(tid)
        if h:
            facts.append(
                f"{h.role} {h.name} ({h.url}): {'up' if h.up else 'DOWN'}, its last good scrape "
                f"{age_text(now - h.last_success_ts) if h.last_success_ts else 'never'}"
            )
    if side:
        budgeter = state.get("budgeter") or {}
        facts.append(
            f"sidecar state as of {fmt_ts(side['ts'])}: regime {side.get('regime')}, budgeter "
            f"{budgeter.get('mode')} bands {budgeter.get('low')}-{budgeter.get('high')}, compaction "
            + (
                f"deferred until {fmt_ts(side['compaction_deferred_until'])}"
                if side.get("compaction_deferred_until") and side["compaction_deferred_until"] > now
                else "not deferred"
            )
        )
        facts.append(
            f"queue at the sidecar: {backlog.get('waiting', '?')} waiting (oldest "
            f"{duration_text(backlog.get('oldest_waiting_s'))}), {backlog.get('parked', '?')} parked "
            f"(oldest {duration_text(backlog.get('oldest_parked_s'))})"
        )
        for warning in side.get("warnings") or []:
            facts.append(f"sidecar warning: {warning}")
    for row in firing.itertuples() if not firing.empty else ():
        facts.append(
            f"firing for {duration_text(now - row.started_ts)} (since {fmt_ts(row.started_ts)}): "
            f"{row.rule} ({row.severity})"
        )
    st.text("\n".join(facts))


def status_at(
    ref: q.EngineRef, at: float, side: pd.DataFrame, eng: pd.DataFrame, alerts: pd.DataFrame
) -> None:
    """The state at `at` from the stored samples and alerts of that time (not the live banner)."""
    firing = set()
    if not alerts.empty:
        mine = alerts[alerts["target_id"].isin(ref.target_ids)]
        live_then = (mine["started_ts"] <= at) & (mine["resolved_ts"].isna() | (mine["resolved_ts"] > at))
        firing = set(mine[live_then]["rule"])
    e_up, s_up = last_value(eng, "up", at), last_value(side, "up", at)
    vals = {
        name: last_value(side, name, at)
        for name in (
            "token_weighted",
            "request_weighted",
            "divergence",
            "waiting",
            "oldest_waiting_s",
            "thin_reuse",
            "demand_fraction",
        )
    }
    if e_up == 0.0 or s_up == 0.0 or "target-down" in firing:
        state, reason = "down", f"{'engine' if e_up == 0.0 else 'sidecar'} not answering at that time"
    elif "collapse" in firing:
        state, reason = "collapsed", "alert collapse firing at that time"
    elif "admission-wait" in firing:
        state, reason = (
            "queueing",
            (
                f"{_n(vals['waiting'])} sessions waiting at the sidecar, the oldest for "
                f"{duration_text(vals['oldest_waiting_s'])}"
            ),
        )
    elif vals["thin_reuse"] == 1.0 or "thin-reuse" in firing:
        state, reason = "thin-reuse", f"thin-reuse regime at that time (D = {_f(vals['divergence'])})"
    elif e_up is None and s_up is None and vals["token_weighted"] is None:
        state, reason = "unknown", "no samples stored at or before that time in this window"
    else:
        state, reason = "healthy", "up, normal reuse regime, no collapse alert at that time"
    step = NEXT_STEP.get(state)
    text = f"State at {fmt_ts(at)}: {BADGE[state]}: {reason}" + (f". Next: {step}" if step else "")
    BOX.get(state, st.success)(escape_md(text))
    st.text(
        f"at that time: R_t {_f(vals['token_weighted'])}, R_r {_f(vals['request_weighted'])}, "
        f"D {_f(vals['divergence'])}, demand/pool {_f(vals['demand_fraction'])}, waiting at sidecar "
        f"{_n(vals['waiting'])}; alerts firing then: {', '.join(sorted(firing)) or 'none'}"
    )


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _n(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def figures(
    frame: pd.DataFrame, eng: pd.DataFrame, events: pd.DataFrame, settings: Settings, common: dict[str, Any]
) -> dict[str, go.Figure]:
    out = {
        "hit": charts.hit_rate_figure(frame, events, threshold=settings.divergence_threshold, **common),
        "kv": charts.kv_figure(frame, events, **common),
        "backlog": charts.backlog_figure(frame, events, **common),
        "cost": charts.lines_figure(
            charts.relative_cost_frame(eng, settings.cached_token_price),
            ("relative_cost",),
            events,
            title="Relative input cost (1 = no cache) (UTC)",
            y_title="cost / uncached cost",
            y_range=(0, 1.05),
            **common,
        ),
    }
    present = set(frame["signal"])
    waits = ("time_to_admit_p50", "time_to_admit_p95", "park_time_p50", "park_time_p95", "oldest_waiting_s")
    if present & set(waits):
        out["admission"] = charts.lines_figure(
            frame,
            waits,
            events,
            title="The sidecar's queue: time to admit, park time, oldest wait (UTC)",
            y_title="seconds",
            **common,
        )
    for name, (signals, title, y_title) in SERVING.items():
        if present & set(signals):
            out[name] = charts.lines_figure(frame, signals, events, title=title, y_title=y_title, **common)
    return out


def missing_serving_signals(eng: pd.DataFrame) -> list[str]:
    present = set(eng["signal"])
    return [
        title.removesuffix(" (UTC)") for signals, title, _y in SERVING.values() if not present & set(signals)
    ]


def per_model_table(url: str, ref: q.EngineRef, window: TimeWindow) -> None:
    """Per-model breakdown by the request's ``model`` at the sidecar (its /state ``models`` section)."""
    if ref.sidecar_target_id is None:
        return
    side = data.sidecar_states(url).get(ref.sidecar_target_id, {})
    state = side.get("state") if isinstance(side.get("state"), dict) else {}
    models = state.get("models")
    at = asof.moment(window)
    st.subheader(
        "Per model (by the request's `model` at the sidecar)"
        + ("" if at is None else f", {asof.now_label(at)}")
    )
    if at is not None:
        st.caption(asof.now_only("The per-model table", at))
    if not isinstance(models, dict) or not models:
        st.caption("This sidecar reports no per-model breakdown (one model, or a sidecar without it).")
        return
    rows = [
        {"model": str(name), **{k: v for k, v in stats.items() if isinstance(v, int | float)}}
        for name, stats in models.items()
        if isinstance(stats, dict)
    ]
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="engine_models", width="stretch")
