"""Plotly figures for the pages. Pure: frames in, figures out (no Streamlit, no database).

Honesty rules every chart follows:

- a gap in the data is drawn as a gap (no line bridging a scrape outage);
- when the newest sample is older than the stale threshold, the span from it
  to now is shaded grey and labelled "no data since ...";
- operator actions, compaction decisions and alerts opening/closing are drawn
  as markers on every time chart, with hover text saying what happened;
- times are UTC and say so;
- every text that reaches a hover label, legend or annotation goes through `plain()`: plotly
  renders a subset of HTML there (``<b>``, ``<a href>``), and subtree ids, reasons, actors and
  session ids are set by clients.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLORS = {
    "token_weighted": "#1f77b4",
    "request_weighted": "#ff7f0e",
    "divergence": "#6a3d9a",
    "engine_hit_ratio": "#7f7f7f",
    "demand_fraction": "#1f4e79",
    "kv_usage": "#8c8c8c",
    "band_low": "#2ca02c",
    "band_high": "#d62728",
    "admitted": "#1f77b4",
    "parked": "#ff7f0e",
    "waiting": "#d62728",
    "turns_per_s": "#2ca02c",
    "requests_running": "#1f77b4",
    "requests_waiting": "#d62728",
    "ttft_p50": "#2ca02c",
    "ttft_p90": "#ff7f0e",
    "ttft_p99": "#d62728",
    "relative_cost": "#1f4e79",
    "prompt_tokens_per_s": "#1f77b4",
    "time_to_admit_p50": "#2ca02c",
    "time_to_admit_p95": "#ff7f0e",
    "park_time_p50": "#9467bd",
    "park_time_p95": "#8c564b",
    "oldest_waiting_s": "#d62728",
    "generation_tokens_per_s": "#2ca02c",
    "preemptions_per_s": "#d62728",
    **{
        f"{base}_p{q}": color
        for base in ("e2e", "itl", "queue_time", "prompt_len", "output_len")
        for q, color in ((50, "#2ca02c"), (90, "#ff7f0e"), (99, "#d62728"))
    },
}
LABELS = {
    "token_weighted": "R_t (token-weighted)",
    "request_weighted": "R_r (request-weighted)",
    "divergence": "D = R_r - R_t",
    "engine_hit_ratio": "engine prefix-cache hit ratio",
    "demand_fraction": "KV demand / pool",
    "kv_usage": "engine KV usage gauge",
    "band_low": "low band",
    "band_high": "high band",
    "admitted": "admitted",
    "parked": "parked",
    "waiting": "waiting",
    "turns_per_s": "turns/s",
    "requests_running": "running",
    "requests_waiting": "waiting",
    "ttft_p50": "TTFT p50",
    "ttft_p90": "TTFT p90",
    "ttft_p99": "TTFT p99",
    "relative_cost": "relative input cost",
    "prompt_tokens_per_s": "prompt tokens/s",
    "time_to_admit_p50": "time to admit p50",
    "time_to_admit_p95": "time to admit p95",
    "park_time_p50": "park time p50",
    "park_time_p95": "park time p95",
    "oldest_waiting_s": "oldest wait",
    "generation_tokens_per_s": "generation tokens/s",
    "preemptions_per_s": "preemptions/s",
    **{
        f"{base}_p{q}": f"{name} p{q}"
        for base, name in (
            ("e2e", "e2e"),
            ("itl", "ITL"),
            ("queue_time", "queue"),
            ("prompt_len", "prompt length"),
            ("output_len", "output length"),
        )
        for q in (50, 90, 99)
    },
}
EVENT_STYLE = {
    "action": ("#1f4e79", "diamond", "operator action"),
    "compaction": ("#6a3d9a", "triangle-down", "compaction decision"),
    "alert": ("#d62728", "x", "alert"),
}
# No plotly template: st.plotly_chart's "streamlit" theme styles the charts in the browser, and applying
# a template server-side costs ~10 ms per figure (measured), a third of a figure's build time.
# The legend sits below the time axis's tick labels (never over an axis title); y axes get few, round ticks.
BASE_LAYOUT = dict(
    margin=dict(l=60, r=20, t=40, b=70),
    height=320,
    legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0),
    hovermode="x unified",
)


def plain(text: object) -> str:
    """Text made inert for plotly's HTML-subset labels (no tags, links or entities)."""
    return html.escape(str(text), quote=False)


def to_time(ts: pd.Series | Sequence[float] | float) -> pd.Series | pd.Timestamp:
    if isinstance(ts, int | float):
        return pd.to_datetime(ts, unit="s", utc=True)
    return pd.to_datetime(pd.Series(ts, dtype=float), unit="s", utc=True)


def with_gaps(frame: pd.DataFrame, max_gap: float) -> pd.DataFrame:
    """Insert a NaN row wherever consecutive samples are further apart than `max_gap` seconds."""
    if frame.empty or len(frame) < 2:
        return frame
    frame = frame.sort_values("ts")
    gaps = frame["ts"].diff() > max_gap
    if not gaps.any():
        return frame
    breaks = frame.loc[gaps, ["ts"]].copy()
    breaks["ts"] = breaks["ts"] - max_gap / 2
    breaks["value"] = float("nan")
    return pd.concat([frame, breaks], ignore_index=True).sort_values("ts")


def across(points: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    """A setting's points (ts, value) held from the window's start to its end: a band is drawn across
    the whole range (its first value back to the start, its last value on to the end)."""
    if points.empty:
        return points
    points = points.dropna().sort_values("ts")
    if points.empty:
        return points
    head = pd.DataFrame({"ts": [start], "value": [points["value"].iloc[0]]})
    tail = pd.DataFrame({"ts": [end], "value": [points["value"].iloc[-1]]})
    return pd.concat([head, points, tail], ignore_index=True)


def signal_line(
    frame: pd.DataFrame,
    signal: str,
    *,
    max_gap: float,
    name: str | None = None,
    dash: str | None = None,
    width: float = 2.0,
    color: str | None = None,
) -> go.Scatter | None:
    part = frame[frame["signal"] == signal][["ts", "value"]]
    if part.empty:
        return None
    part = with_gaps(part, max_gap)
    return go.Scatter(
        x=to_time(part["ts"]),
        y=part["value"],
        mode="lines",
        name=plain(name or LABELS.get(signal, signal)),
        line=dict(color=color or COLORS.get(signal), dash=dash, width=width),
        connectgaps=False,
    )


def add_staleness(
    fig: go.Figure, last_ts: float | None, now: float, stale_after: float, *, rows: int = 1
) -> None:
    """Shade the span from the newest sample to now when the data is stale."""
    if last_ts is None or now - last_ts <= stale_after:
        return
    for row in range(1, rows + 1):
        fig.add_vrect(
            x0=to_time(last_ts),
            x1=to_time(now),
            fillcolor="#9e9e9e",
            opacity=0.25,
            line_width=0,
            row=row if rows > 1 else None,
            col=1 if rows > 1 else None,
        )
    fig.add_annotation(
        x=to_time(last_ts),
        y=1.0,
        yref="paper",
        xanchor="right",
        showarrow=False,
        text=f"no data since {to_time(last_ts):%H:%M:%S} UTC",
        font=dict(color="#616161"),
        bgcolor="rgba(255,255,255,0.8)",
    )


def mark_moment(fig: go.Figure, ts: float, label: str = "the moment of the link") -> None:
    """A solid vertical line through the whole figure at `ts`, labelled at the top."""
    t = to_time(ts)
    fig.add_shape(
        type="line", xref="x", yref="paper", x0=t, x1=t, y0=0, y1=1, line=dict(color="#111111", width=2)
    )
    fig.add_annotation(
        x=t,
        y=1.0,
        yref="paper",
        yanchor="bottom",
        showarrow=False,
        text=f"{label} {t:%H:%M:%S}",
        font=dict(color="#111111", size=11),
        bgcolor="rgba(255,255,255,0.85)",
    )


VLINE_KINDS = ("action", "alert")  # rare and decisive; compaction decisions can be frequent: markers only
MAX_VLINES = 120
MAX_LABELS = 12  # more markers of one kind than this: hover text only (labels would overlap)


def add_events(
    fig: go.Figure, events: pd.DataFrame, *, rows: int = 1, y: float = 1.0, labels: bool = False
) -> None:
    """Markers (with hover text) for operator actions, compaction decisions and alerts, and thin
    vertical lines through the whole figure for actions and alerts (the newest MAX_VLINES)."""
    if events is None or events.empty:
        return
    shapes = []
    for kind, (color, symbol, label) in EVENT_STYLE.items():
        part = events[events["kind"] == kind]
        if part.empty:
            continue
        labelled = labels and kind in VLINE_KINDS and "label" in part and len(part) <= MAX_LABELS
        fig.add_trace(
            go.Scatter(
                x=to_time(part["ts"]),
                y=[y] * len(part),
                mode="markers+text" if labelled else "markers",
                name=label,
                text=[plain(t) for t in part["label"]] if labelled else None,
                textposition="top center",
                textfont=dict(size=10, color=color),
                marker=dict(color=color, symbol=symbol, size=10),
                hovertext=[plain(t) for t in part["text"]],
                hoverinfo="text+x",
                legendgroup=label,
            ),
            **({"row": 1, "col": 1} if rows > 1 else {}),
        )
        if kind in VLINE_KINDS:
            for t in to_time(part["ts"].tail(MAX_VLINES)):
                shapes.append(
                    dict(
                        type="line",
                        xref="x",
                        yref="paper",
                        x0=t,
                        x1=t,
                        y0=0,
                        y1=1,
                        opacity=0.5,
                        line=dict(color=color, width=1, dash="dot"),
                    )
                )
    if shapes:
        # One layout update: add_vline per event costs ~2 ms each (measured), too much for a busy week.
        fig.update_layout(shapes=list(fig.layout.shapes or ()) + shapes[-MAX_VLINES:])


def _finish(fig: go.Figure, start: float, end: float, title: str, *, height: int = 320) -> go.Figure:
    fig.update_layout(**{**BASE_LAYOUT, "height": height}, title=dict(text=title, font=dict(size=14)))
    fig.update_xaxes(range=[to_time(start), to_time(end)], title_text=None)
    fig.update_yaxes(nticks=6)
    return fig


def hit_rate_figure(
    frame: pd.DataFrame,
    events: pd.DataFrame | None,
    *,
    threshold: float,
    start: float,
    end: float,
    now: float,
    stale_after: float,
    max_gap: float,
    title: str = "Prefix-cache reuse (UTC)",
) -> go.Figure:
    """R_t and R_r on one chart; D below it with the thin-reuse zone above the threshold shaded."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.62, 0.38], vertical_spacing=0.06)
    for signal, dash in (("token_weighted", None), ("request_weighted", None), ("engine_hit_ratio", "dot")):
        trace = signal_line(frame, signal, max_gap=max_gap, dash=dash, width=1.5 if dash else 2.2)
        if trace is not None:
            fig.add_trace(trace, row=1, col=1)
    d = signal_line(frame, "divergence", max_gap=max_gap)
    if d is not None:
        fig.add_trace(d, row=2, col=1)
    fig.add_hrect(y0=threshold, y1=1.0, fillcolor="#d62728", opacity=0.08, line_width=0, row=2, col=1)
    fig.add_hline(
        y=threshold,
        line=dict(color="#d62728", dash="dash", width=1),
        row=2,
        col=1,
        annotation_text=f"thin-reuse threshold {threshold:g}",
        annotation_position="top left",
    )
    fig.update_yaxes(range=[0, 1.05], title_text="hit rate", row=1, col=1)
    fig.update_yaxes(range=[-0.1, 1.0], title_text="D", row=2, col=1)
    add_events(fig, events if events is not None else pd.DataFrame(), rows=2, y=1.03, labels=True)
    drawn = frame[
        frame["signal"].isin(["token_weighted", "request_weighted", "engine_hit_ratio", "divergence"])
    ]
    add_staleness(fig, _last_ts(drawn), now, stale_after, rows=2)
    _finish(fig, start, end, title, height=450)
    fig.update_layout(margin=dict(t=70))  # room for the markers' labels above the plot
    return fig


def kv_figure(
    frame: pd.DataFrame,
    events: pd.DataFrame | None,
    *,
    start: float,
    end: float,
    now: float,
    stale_after: float,
    max_gap: float,
) -> go.Figure:
    """KV demand against the pool with the bands, beside the engine's own usage gauge."""
    fig = go.Figure()
    for signal, dash, width in (("demand_fraction", None, 2.4), ("kv_usage", "dot", 1.5)):
        trace = signal_line(frame, signal, max_gap=max_gap, dash=dash, width=width)
        if trace is not None:
            fig.add_trace(trace)
    for signal in ("band_low", "band_high"):
        band = across(frame[frame["signal"] == signal][["ts", "value"]], start, end)
        if not band.empty:
            fig.add_trace(
                go.Scatter(
                    x=to_time(band["ts"]),
                    y=band["value"],
                    mode="lines",
                    line_shape="hv",
                    name=LABELS[signal],
                    line=dict(color=COLORS[signal], dash="dash", width=1.2),
                )
            )
    fig.update_yaxes(title_text="fraction of KV pool", rangemode="tozero")
    add_events(fig, events if events is not None else pd.DataFrame(), y=1.0)
    add_staleness(fig, _last_ts(frame), now, stale_after)
    return _finish(fig, start, end, "KV demand vs pool, with bands (UTC)")


def backlog_figure(
    frame: pd.DataFrame,
    events: pd.DataFrame | None,
    *,
    start: float,
    end: float,
    now: float,
    stale_after: float,
    max_gap: float,
) -> go.Figure:
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for signal in ("admitted", "parked", "waiting"):
        part = frame[frame["signal"] == signal][["ts", "value"]]
        if part.empty:
            continue
        part = with_gaps(part, max_gap)
        fig.add_trace(
            go.Scatter(
                x=to_time(part["ts"]),
                y=part["value"],
                name=LABELS[signal],
                stackgroup="backlog",
                mode="lines",
                # filled areas only: a 1-px edge of an empty layer (0 waiting) drew a "waiting" line on top
                # of the admitted stack, which read as sessions waiting (seen on the real-engine demo)
                line=dict(color=COLORS[signal], width=0),
            ),
            secondary_y=False,
        )
    turns = signal_line(frame, "turns_per_s", max_gap=max_gap, dash="dot")
    if turns is not None:
        fig.add_trace(turns, secondary_y=True)
    fig.update_yaxes(title_text="sessions", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="turns/s", secondary_y=True, rangemode="tozero", showgrid=False)
    add_events(fig, events if events is not None else pd.DataFrame(), y=0)
    add_staleness(fig, _last_ts(frame), now, stale_after)
    return _finish(fig, start, end, "Backlog (admitted, parked, waiting) and turns/s (UTC)")


def lines_figure(
    frame: pd.DataFrame,
    signals: Sequence[str],
    events: pd.DataFrame | None,
    *,
    title: str,
    y_title: str,
    start: float,
    end: float,
    now: float,
    stale_after: float,
    max_gap: float,
    y_range: tuple[float, float] | None = None,
) -> go.Figure:
    fig = go.Figure()
    for signal in signals:
        trace = signal_line(frame, signal, max_gap=max_gap)
        if trace is not None:
            fig.add_trace(trace)
    fig.update_yaxes(title_text=y_title, rangemode="tozero", range=list(y_range) if y_range else None)
    add_events(fig, events if events is not None else pd.DataFrame(), y=y_range[1] if y_range else 0)
    add_staleness(fig, _last_ts(frame), now, stale_after)
    return _finish(fig, start, end, title)


def relative_cost_frame(frame: pd.DataFrame, cached_price: float) -> pd.DataFrame:
    """Input cost relative to no caching: (uncached + price x cached) / prompt, per timestamp.

    Rates are summed over engine labels first (sum the rates, then divide).
    """
    part = frame[frame["signal"].isin(["prompt_tokens_per_s", "cached_tokens_per_s"])]
    if part.empty:
        return pd.DataFrame(columns=["ts", "signal", "value"])
    wide = part.pivot_table(index="ts", columns="signal", values="value", aggfunc="sum")
    if "prompt_tokens_per_s" not in wide or "cached_tokens_per_s" not in wide:
        return pd.DataFrame(columns=["ts", "signal", "value"])
    prompt = wide["prompt_tokens_per_s"]
    cached = wide["cached_tokens_per_s"].clip(lower=0)
    cost = ((prompt - cached).clip(lower=0) + cached_price * cached) / prompt.where(prompt > 0)
    out = cost.dropna().rename("value").reset_index()
    out["signal"] = "relative_cost"
    return out[["ts", "signal", "value"]]


def overview_figure(
    frame: pd.DataFrame,
    names: dict[int, str],
    *,
    start: float,
    end: float,
    now: float,
    stale_after: float,
    max_gap: float,
) -> go.Figure:
    """R_t (solid) and R_r (dashed) per engine on one chart."""
    fig = go.Figure()
    palette = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e"]
    for i, (target_id, name) in enumerate(names.items()):
        part = frame[frame["target_id"] == target_id]
        color = palette[i % len(palette)]
        for signal, dash in (("token_weighted", None), ("request_weighted", "dash")):
            label = "R_t" if signal == "token_weighted" else "R_r"
            trace = signal_line(part, signal, max_gap=max_gap, name=f"{name} {label}", dash=dash, color=color)
            if trace is not None:
                fig.add_trace(trace)
        last = _last_ts(part)
        if last is not None and now - last > stale_after:
            fig.add_annotation(
                x=to_time(last),
                y=float(part.loc[part["ts"].idxmax(), "value"]),
                showarrow=True,
                arrowhead=2,
                ax=30,
                ay=-25,
                font=dict(color="#616161"),
                text=f"{plain(name)}: no data since {to_time(last):%H:%M:%S} UTC",
                bgcolor="#eeeeee",
            )
    fig.update_yaxes(range=[0, 1.05], title_text="hit rate")
    add_staleness(fig, _last_ts(frame), now, stale_after)
    return _finish(fig, start, end, "R_t (solid) and R_r (dashed) per engine (UTC)")


def _last_ts(frame: pd.DataFrame) -> float | None:
    if frame is None or frame.empty:
        return None
    return float(frame["ts"].max())
