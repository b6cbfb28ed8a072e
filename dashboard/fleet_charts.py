"""Fleet charts for the Overview: a signal's distribution across engines over time (the p10-p90 band
and the median), with the worst few engines drawn on top by name. Per-engine lines for every engine
are the Engine page's job: at 200 engines they are unreadable.

Honesty: points a sidecar reported after its engine stopped answering are dropped (`drop_frozen`),
so a hung engine's frozen R_t does not hold the distribution up; the span after the newest data is
shaded as on every chart (`dashboard.charts.add_staleness`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from dashboard import charts
from dashboard.fleet import quantile_frame
from db.queries.series import choose_resolution

WORST_COLORS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")


def bucket_seconds(start: float, end: float, max_points: int) -> float:
    """The bucket width a series read of [start, end] at `max_points` comes in (0 = raw samples)."""
    return choose_resolution(start, end, max_points=max_points)[1]


def drop_frozen(frame: pd.DataFrame, frozen_after: Mapping[int, float]) -> pd.DataFrame:
    """Leave out each target's points after the given time (its engine's last good scrape)."""
    if frame.empty or not frozen_after:
        return frame
    cutoff = frame["target_id"].map(frozen_after)
    return frame[cutoff.isna() | (frame["ts"] <= cutoff)]


def distribution_figure(
    frame: pd.DataFrame,
    signal: str,
    worst: Sequence[tuple[int, str]],
    *,
    title: str,
    y_title: str,
    start: float,
    end: float,
    now: float,
    stale_after: float,
    max_gap: float,
    y_range: tuple[float, float] | None = None,
    threshold: float | None = None,
    threshold_label: str | None = None,
    tickformat: str | None = None,
    marker_ts: float | None = None,
    bucket_s: float = 0.0,
) -> go.Figure:
    """p10-p90 band and p50 of `signal` across engines, and the `worst` (target id, name) engines as lines.

    `bucket_s`: the width of the buckets the frame was read in (`bucket_seconds`). A bucket is stamped with
    its start, so its newest sample can be up to a bucket later: the chart is stale only when even the end
    of its newest bucket is older than `stale_after`.
    """
    fig = go.Figure()
    q = quantile_frame(frame, signal)
    if not q.empty:
        q = charts.with_gaps(q.rename(columns={"p50": "value"}), max_gap).rename(columns={"value": "p50"})
        x = charts.to_time(q["ts"])
        fig.add_trace(
            go.Scatter(
                x=x,
                y=q["p90"],
                mode="lines",
                line=dict(width=0),
                showlegend=False,
                hoverinfo="skip",
                connectgaps=False,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=q["p10"],
                mode="lines",
                line=dict(width=0),
                fill="tonexty",
                fillcolor="rgba(31,119,180,0.18)",
                name="p10-p90 of engines",
                connectgaps=False,
                customdata=q["p90"],
                hovertemplate="p10 %{y:.2f}, p90 %{customdata:.2f}",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=q["p50"],
                mode="lines",
                line=dict(color="#1f77b4", width=2),
                name="median",
                connectgaps=False,
                customdata=q["engines"],
                hovertemplate="median %{y:.2f} over %{customdata} engines",
            )
        )
    for i, (target_id, name) in enumerate(worst):
        trace = charts.signal_line(
            frame[frame["target_id"] == target_id],
            signal,
            max_gap=max_gap,
            name=name,
            color=WORST_COLORS[i % len(WORST_COLORS)],
            width=1.3,
        )
        if trace is not None:
            fig.add_trace(trace)
    if threshold is not None:
        fig.add_hline(
            y=threshold,
            line=dict(color="#d62728", dash="dash", width=1),
            annotation_text=threshold_label or f"threshold {threshold:g}",
            annotation_position="top left",
        )
    fig.update_yaxes(
        title_text=y_title,
        range=list(y_range) if y_range else None,
        rangemode="tozero",
        tickformat=tickformat,
        nticks=6,
    )
    if tickformat == "d":  # counts: whole-number ticks (a 0..1 range would otherwise read 0, 0, 0, 1)
        values = frame.loc[frame["signal"] == signal, "value"] if not frame.empty else pd.Series(dtype=float)
        top = float(values.max()) if len(values) and pd.notna(values.max()) else 0.0
        fig.update_yaxes(tick0=0, dtick=max(1, math.ceil(top / 5)), range=[0, max(1.0, top) * 1.05])
    if marker_ts is not None:
        charts.mark_moment(fig, marker_ts)
    charts.add_staleness(
        fig, None if frame.empty else float(frame["ts"].max()), min(now, end), stale_after + bucket_s
    )
    fig.update_layout(**{**charts.BASE_LAYOUT, "height": 290}, title=dict(text=title, font=dict(size=14)))
    fig.update_xaxes(range=[charts.to_time(start), charts.to_time(end)])
    return fig
