"""Collapse risk on the pages: the Overview's risk column and the Engine page's risk timeline.

The collectors store the score (``collapse_risk``) and each input's contribution (``risk_<input>``, see
`core.risk`) on the key the risk was judged for: the sidecar's target (label "") when a sidecar fronts the
engine, else each label of the bare engine. Pages call `add_columns` and `render_timeline`; everything
else here is pure (frames in, rows or figures out).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from core import risk as model
from core import signals as sig
from core.alerts import AlertSettings
from dashboard import charts
from dashboard.frames import EngineRef, Latest

SIGNALS = sig.RISK_SIGNALS
_SETTINGS = AlertSettings()
NAME_OF_SIGNAL = {v: k for k, v in model.SIGNAL_OF_INPUT.items()}
NOT_COMPUTED = "not computed"
RISK_HELP = (
    f"collapse risk 0-1 (warns at {_SETTINGS.risk_enter:g}), docs/collapse-risk.md. Blank: {NOT_COMPUTED}, "
    "the collectors have no sample of any input of the engine's mode (sidecar or engine-only) yet."
)
LEADING_HELP = (
    "the inputs that contribute most to the risk now, largest first; none: no input is under pressure; "
    f"{NOT_COMPUTED}: no risk score yet (see the risk column)"
)


def _risk_target(ref: EngineRef) -> int | None:
    return ref.sidecar_target_id if ref.sidecar_target_id is not None else ref.engine_target_id


def latest_risk(ref: EngineRef, latest: Latest) -> tuple[float | None, str]:
    """The newest score of an engine (the highest over a bare engine's labels) and its leading inputs."""
    target = _risk_target(ref)
    if target is None:
        return None, ""
    labels = [""] if ref.sidecar_target_id is not None else (latest.labels(target) or [""])
    best: tuple[float, str] | None = None
    for label in labels:
        score = latest.value(target, sig.COLLAPSE_RISK, label)
        if score is not None and (best is None or score > best[0]):
            best = (score, label)
    if best is None:
        return None, ""
    contributions = [
        (latest.value(target, s, best[1]) or 0.0, NAME_OF_SIGNAL[s]) for s in sig.RISK_INPUT_SIGNALS
    ]
    leading = [name for value, name in sorted(contributions, key=lambda c: (-c[0], c[1])) if value > 0][:3]
    return best[0], ", ".join(leading)


def add_columns(rows: list[dict[str, Any]], latest: Latest) -> None:
    """Add ``risk`` (0-1) and ``risk: leading inputs`` to the Overview's rows (each has its ``ref``)."""
    for row in rows:
        score, leading = latest_risk(row["ref"], latest)
        added = {
            "risk": score,
            "risk: leading inputs": leading or (NOT_COMPUTED if score is None else "none"),
        }
        items = list(row.items())
        row.clear()
        for key, value in items:  # right after the state's "why"
            row[key] = value
            if key == "why":
                row.update(added)
        row.update({k: v for k, v in added.items() if k not in row})


def timeline_figure(frame: pd.DataFrame, *, start: float, end: float, max_gap: float) -> go.Figure:
    """Stacked contributions of every input over time, the score on top, the warning's enter/exit lines."""
    fig = go.Figure()
    if not frame.empty and "engine_label" in frame:
        # a bare engine with several labels: the label with the highest score at each instant is not
        # tracked; show the mean over labels (one line per input stays readable)
        frame = frame.groupby(["ts", "signal"], as_index=False)["value"].mean()
    for s in sig.RISK_INPUT_SIGNALS:
        part = frame[frame["signal"] == s] if not frame.empty else frame
        if part.empty or float(part["value"].max()) <= 0:
            continue
        part = charts.with_gaps(part.sort_values("ts"), max_gap)
        fig.add_trace(
            go.Scatter(
                x=charts.to_time(part["ts"]),
                y=part["value"],
                name=NAME_OF_SIGNAL[s],
                mode="lines",
                stackgroup="inputs",
                line={"width": 0.5},
                hovertemplate="%{y:.2f}",
            )
        )
    score = frame[frame["signal"] == sig.COLLAPSE_RISK] if not frame.empty else frame
    if not score.empty:
        score = charts.with_gaps(score.sort_values("ts"), max_gap)
        fig.add_trace(
            go.Scatter(
                x=charts.to_time(score["ts"]),
                y=score["value"].clip(upper=1.0),
                name="risk score",
                mode="lines",
                line={"color": "black", "width": 2},
                hovertemplate="%{y:.2f}",
            )
        )
    for y, text in ((_SETTINGS.risk_enter, "warns"), (_SETTINGS.risk_exit, "clears")):
        fig.add_hline(
            y=y,
            line={"dash": "dash", "width": 1, "color": "#c62828" if text == "warns" else "#9e9e9e"},
            annotation_text=f"{text} ({y:g})",
            annotation_position="top left",
        )
    fig.update_yaxes(range=[0, 1.05], title="collapse risk")
    fig.update_xaxes(range=[charts.to_time(start), charts.to_time(end)])
    fig.update_layout(
        title="Collapse risk and its inputs (stacked contributions)",
        height=320,
        margin={"l": 40, "r": 10, "t": 40, "b": 30},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def leading_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The newest contribution of each input under pressure, largest first, with what it means."""
    if frame.empty:
        return pd.DataFrame(columns=["input", "contribution", "why"])
    newest = frame.sort_values("ts").groupby("signal").tail(1)
    rows = [
        {
            "input": NAME_OF_SIGNAL[r.signal],
            "contribution": float(r.value),
            "why": model.WHY[NAME_OF_SIGNAL[r.signal]],
        }
        for r in newest.itertuples()
        if r.signal in NAME_OF_SIGNAL and r.value > 0
    ]
    return pd.DataFrame(
        sorted(rows, key=lambda r: -r["contribution"]), columns=["input", "contribution", "why"]
    )


def render_timeline(url: str, ref: EngineRef, start: float, end: float, max_gap: float) -> None:
    """The Engine page's risk panel: the timeline and the leading inputs now."""
    import streamlit as st

    from dashboard import data

    st.subheader("Collapse risk")
    target = _risk_target(ref)
    frame = pd.DataFrame(columns=["ts", "target_id", "engine_label", "signal", "value"])
    if target is not None:
        frame = data.series(url, (target,), SIGNALS, start, end)
    if frame.empty:
        st.caption(
            "No collapse-risk samples in this range (the collectors compute it every scrape; "
            "an engine a sidecar fronts is judged on its sidecar)."
        )
        return
    st.plotly_chart(
        timeline_figure(frame, start=start, end=end, max_gap=max_gap), key="engine_risk", width="stretch"
    )
    table = leading_table(frame)
    mode = "sidecar" if ref.sidecar_target_id is not None else "engine-only"
    st.caption(f"Judged on {mode} inputs (docs/collapse-risk.md). Leading inputs at the end of the range:")
    if table.empty:
        st.caption("none under pressure.")
    else:
        st.dataframe(
            table,
            hide_index=True,
            key="engine_risk_leading",
            width="stretch",
            column_config={"contribution": st.column_config.NumberColumn(format="%.2f")},
        )
