"""Why misses happen (issue 16 item 2), for the Engine and Sessions pages: missed prompt tokens by cause over
time (stacked in the order of `core.attribution.CAUSES`), the "hits counted for recomputation" series, and
the sessions with the most missed tokens. Computed by `db.queries.miss_attribution` from the turn trace.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from core import signals as sig
from core.attribution import CAUSES, MISS_CAUSES
from dashboard import charts, data
from dashboard import frames as q
from db import queries

CAUSE_COLORS = {
    "cold": "#9e9e9e",
    "new": "#cfd8dc",
    "partial-block": "#b0bec5",
    "prefix-changed": "#8e24aa",
    "routed-away": "#1e88e5",
    "evicted-parked": "#fb8c00",
    "evicted-pressure": "#e53935",
    "unattributed": "#6d4c41",
}
MAX_BUCKETS = 120


def bucket_for(span_s: float) -> float:
    """A round bucket giving at most `MAX_BUCKETS` bars."""
    for step in (10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400):
        if span_s / step <= MAX_BUCKETS:
            return float(step)
    return 86400.0


def _bucket_totals(found: dict[str, Any], start: float, bucket: float) -> dict[float, float]:
    """Per-second rates read raw, as totals per bucket: mean rate over the bucket (summed over the engine
    ranks sampled together) x bucket length."""
    out: dict[float, list[float]] = {}
    for s in found["series"]:
        for ts, value in zip(s["ts"], s["value"], strict=True):
            if value is not None:
                key = start + math.floor((ts - start) / bucket) * bucket
                out.setdefault(key, []).append(value)
    ranks = max(1, len(found["series"]))
    return {k: sum(v) / len(v) * ranks * bucket for k, v in out.items()}


def recomputation_buckets(hits: dict[float, float], preemptions: dict[float, float]) -> dict[float, float]:
    """The engine's prefix-cache hits of the buckets in which it preempted, the only ones where hits beyond
    the sidecar's cached tokens can be recomputation. Elsewhere the two differ by timing alone (the engine
    counts a prompt when it schedules it, the sidecar when the turn finishes; rates are sampled): on the
    real vLLM engine, without any preemption, that difference reached thousands of tokens a bucket."""
    return {k: v for k, v in hits.items() if preemptions.get(k, 0.0) > 0.0}


def _engine_hits(
    conn: Any, engine_id: int | None, start: float, end: float, bucket: float
) -> dict[float, float] | None:
    if engine_id is None:
        return None

    def read(signal: str) -> dict[float, float]:
        found = queries.series_range(
            conn, signals=signal, start_ts=start, end_ts=end, target_ids=[engine_id], resolution="raw"
        )
        return _bucket_totals(found, start, bucket)

    return recomputation_buckets(read(sig.PREFIX_CACHE_HITS_PER_S), read(sig.PREEMPTIONS_PER_S))


def attribution(conn: Any, ref: q.EngineRef, start: float, end: float) -> dict[str, Any]:
    bucket = bucket_for(end - start)
    hits = _engine_hits(conn, ref.engine_target_id, start, end, bucket)
    return queries.miss_attribution(
        conn,
        sidecar_ids=[ref.sidecar_target_id] if ref.sidecar_target_id else [],
        start_ts=start,
        end_ts=end,
        bucket_s=bucket,
        engine_hits=hits,
    )


@st.cache_data(ttl=data.TTL, show_spinner=False)
def cached_attribution(url: str, ref: q.EngineRef, start: float, end: float) -> dict[str, Any]:
    return data._read(url, attribution, ref, start, end)


def figure(result: dict[str, Any], *, start: float, end: float, include_new: bool = False) -> go.Figure:
    frame = pd.DataFrame(result["buckets"])
    fig = go.Figure()
    shown = [c for c in CAUSES if include_new or c in MISS_CAUSES]
    if not frame.empty:
        x = charts.to_time(frame["ts"])
        for cause in shown:
            fig.add_trace(go.Bar(x=x, y=frame[cause], name=cause, marker_color=CAUSE_COLORS[cause]))
        if frame["recomputed"].notna().any():
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=frame["recomputed"],
                    name="hits counted for recomputation",
                    mode="lines+markers",
                    line=dict(color="black", dash="dot"),
                )
            )
    fig.update_layout(barmode="stack", yaxis_title="prompt tokens")
    return charts._finish(fig, start, end, "Missed prompt tokens by cause (UTC)", height=340)


def sessions_frame(result: dict[str, Any]) -> pd.DataFrame:
    rows = [
        {
            "session": s["session"],
            "missed tokens": s["missed"],
            "turns": s["turns"],
            "prompt tokens": s["prompt_tokens"],
            **{c: s[c] for c in MISS_CAUSES},
        }
        for s in result["sessions"]
    ]
    return pd.DataFrame(rows, columns=["session", "missed tokens", "turns", "prompt tokens", *MISS_CAUSES])


def engine_panel(url: str, ref: q.EngineRef, start: float, end: float) -> None:
    """The Engine page's chart: missed tokens by cause, and hits counted for recomputation."""
    if ref.sidecar_target_id is None:
        st.caption("Missed tokens by cause need a sidecar's turn trace: no sidecar fronts this engine.")
        return
    result = cached_attribution(url, ref, start, end)
    include_new = st.toggle("Include new tokens and the partial-block tail", key="misses_new", value=False)
    st.plotly_chart(
        figure(result, start=start, end=end, include_new=include_new), key="engine_misses", width="stretch"
    )
    totals = result["totals"]
    missed = sum(totals[c] for c in MISS_CAUSES)
    st.caption(
        f"{missed:,} missed prompt tokens in this window: "
        + ", ".join(f"{c} {totals[c]:,}" for c in MISS_CAUSES if totals[c])
        + ". "
        "Each turn's uncached tokens go to the first cause that fits (core/attribution.py). The dotted "
        "line, drawn only where the engine preempted, is its prefix-cache hits beyond the sidecar's cached "
        "tokens: recomputation after preemption, which the simulator and older vLLM V1 releases count as "
        "hits (vLLM 0.32 does not: docs/real-engine.md); not a per-turn cause."
    )


def sessions_panel(url: str, ref: q.EngineRef, start: float, end: float) -> None:
    """The Sessions page's list of the sessions with the most missed tokens."""
    result = cached_attribution(url, ref, start, end)
    frame = sessions_frame(result)
    if frame.empty:
        st.caption("No turns recorded in this window (the sidecar's turn trace, GET /turns).")
        return
    st.dataframe(frame, hide_index=True, width="stretch", key="sessions_misses")
