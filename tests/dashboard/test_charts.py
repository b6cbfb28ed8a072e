"""Charts: client-set text reaches plotly's labels inert (issue 11 item 9)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard import charts
from tests.dashboard.fill import NASTY_SESSION


def test_plain_escapes_plotly_markup() -> None:
    assert (
        charts.plain('<a href="x">s</a> & <b>b</b>')
        == '&lt;a href="x"&gt;s&lt;/a&gt; &amp; &lt;b&gt;b&lt;/b&gt;'
    )


def test_event_hover_text_and_trace_names_are_escaped() -> None:
    events = pd.DataFrame(
        {
            "ts": [10.0, 20.0],
            "kind": ["action", "compaction"],
            "text": [f"alice: park session_id={NASTY_SESSION} -> ok", "compaction granted <i>x</i>"],
        }
    )
    fig = go.Figure()
    charts.add_events(fig, events)
    texts = [t for trace in fig.data for t in (trace.hovertext or ())]
    assert texts == [
        "alice: park session_id=&lt;b&gt;sess&lt;/b&gt;*md* [x](javascript:alert(1)) -&gt; ok",
        "compaction granted &lt;i&gt;x&lt;/i&gt;",
    ]
    frame = pd.DataFrame({"ts": [1.0, 2.0], "signal": ["kv_usage"] * 2, "value": [0.1, 0.2]})
    line = charts.signal_line(frame, "kv_usage", max_gap=10, name="<b>e</b>")
    assert line is not None and line.name == "&lt;b&gt;e&lt;/b&gt;"


def _stale_marked(fig: go.Figure) -> bool:
    return any(str(a.text or "").startswith("no data since") for a in fig.layout.annotations)


def test_a_fleet_chart_in_minute_buckets_is_not_stale_while_its_newest_minute_is_filling() -> None:
    """The Overview reads 1 h in 60 s buckets stamped with their start: at 16:37:23 the newest point says
    16:37:00 though samples arrived a second ago. Stale only when even its bucket's end is too old."""
    from dashboard import fleet_charts as fc

    now = 1_800_000_000.0
    assert fc.bucket_seconds(now - 3600, now, 150) == 60.0  # the Overview's FLEET_POINTS over 1 h
    assert fc.bucket_seconds(now - 900, now, 150) == 6.0

    def figure(newest: float, bucket_s: float) -> go.Figure:
        frame = pd.DataFrame(
            {
                "ts": [newest - 120, newest - 60, newest],
                "target_id": [1, 1, 1],
                "engine_label": ["", "", ""],
                "signal": ["token_weighted"] * 3,
                "value": [0.8, 0.85, 0.87],
            }
        )
        return fc.distribution_figure(
            frame,
            "token_weighted",
            [(1, "vllm-cpu")],
            title="R_t",
            y_title="R_t",
            start=now - 3600,
            end=now,
            now=now,
            stale_after=10.0,
            max_gap=180.0,
            bucket_s=bucket_s,
        )

    assert not _stale_marked(figure(now - 23, 60.0))
    assert _stale_marked(figure(now - 23, 0.0))  # raw samples 23 s old are stale
    assert _stale_marked(figure(now - 75, 60.0))  # the newest minute ended 15 s ago: stale


def test_a_count_chart_has_whole_number_ticks() -> None:
    """Sessions waiting, 0 or 1 over the range: ticks 0 and 1, never 0, 0, 0, 0 (the real-engine demo's Overview)."""
    from dashboard import fleet_charts as fc

    now = 1_800_000_000.0
    frame = pd.DataFrame(
        {
            "ts": [now - 60, now - 30],
            "target_id": [1, 1],
            "engine_label": ["", ""],
            "signal": ["waiting"] * 2,
            "value": [1.0, 0.0],
        }
    )
    fig = fc.distribution_figure(
        frame,
        "waiting",
        [(1, "e")],
        title="w",
        y_title="sessions",
        start=now - 900,
        end=now,
        now=now,
        stale_after=10.0,
        max_gap=60.0,
        tickformat="d",
    )
    assert (fig.layout.yaxis.tick0, fig.layout.yaxis.dtick) == (0, 1)
    assert fig.layout.yaxis.range[1] >= 1.0


def test_an_empty_backlog_layer_draws_no_line_on_top_of_the_stack() -> None:
    now = 1_800_000_000.0
    frame = pd.DataFrame(
        {
            "ts": [now - 20, now - 10] * 2,
            "target_id": [1] * 4,
            "engine_label": [""] * 4,
            "signal": ["admitted", "admitted", "waiting", "waiting"],
            "value": [4.0, 4.0, 0.0, 0.0],
        }
    )
    fig = charts.backlog_figure(
        frame, None, start=now - 900, end=now, now=now, stale_after=10.0, max_gap=60.0
    )
    stacked = [t for t in fig.data if t.stackgroup == "backlog"]
    assert {t.name for t in stacked} == {"admitted", "waiting"}
    assert all(t.line.width == 0 for t in stacked)
