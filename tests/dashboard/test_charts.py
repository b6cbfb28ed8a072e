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
