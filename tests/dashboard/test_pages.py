"""AppTests of the read side of the pages: Engine, Sessions, Compaction, Alerts, Audit."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from dashboard.ui import csv_safe
from tests.dashboard.apptest import app, figures, texts, traces
from tests.dashboard.fill import NASTY_SESSION


@pytest.mark.parametrize(
    "page", ["overview", "engine", "sessions", "budgeter", "compaction", "alerts", "audit", "incident"]
)
def test_every_page_renders_signed_out_without_error(db_url: str, page: str) -> None:
    at = app(page)
    assert not at.exception
    assert at.title[0].value == page.capitalize()


def test_engine_page_opens_on_the_first_engine_with_all_charts(db_url: str) -> None:
    at = app("engine")
    assert at.selectbox(key="engine_select").value == "a"
    assert at.query_params["engine"] == "a"
    figs = figures(at)
    assert {"engine_hit_rates", "engine_kv", "engine_backlog", "engine_ttft", "engine_cost"} <= set(figs)
    hit = traces(figs["engine_hit_rates"])
    rt = [y for y in hit["R_t (token-weighted)"]["y"] if y is not None]
    rr = [y for y in hit["R_r (request-weighted)"]["y"] if y is not None]
    assert min(rt) < 0.2 and max(rt) > 0.8  # the collapse 30 minutes ago is inside the last hour
    assert min(rr) > 0.8
    # D has its thin-reuse zone shaded above the threshold.
    shapes = figs["engine_hit_rates"]["layout"]["shapes"]
    assert any(s.get("type") == "rect" and s.get("y0") == 0.5 and s.get("y1") == 1.0 for s in shapes)
    # Cause next to effect: markers for the operator's actions, the gate's decisions and alerts, with hover text.
    actions = hit["operator action"]["hovertext"]
    assert any("alice: park" in t for t in actions)
    assert any("compaction deferred" in t for t in hit["compaction decision"]["hovertext"])
    assert any("alert collapse (critical) opened" in t for t in hit["alert"]["hovertext"])
    kv = traces(figs["engine_kv"])
    assert {"KV demand / pool", "low band", "high band", "engine KV usage gauge"} <= set(kv)
    assert "does not show cache" in texts(at)
    cost = [y for y in traces(figs["engine_cost"])["relative input cost"]["y"] if y is not None]
    assert min(cost) == pytest.approx(1 - 0.9 * 0.9, abs=0.05)  # healthy: 90% cached at a tenth of the price
    assert max(cost) == pytest.approx(1 - 0.9 * 0.1, abs=0.05)  # collapsed: 10% cached
    assert "COLLAPSED" in texts(at)


def test_engine_page_sums_data_parallel_ranks(db_url: str) -> None:
    at = app("engine", engine="b")
    hit = traces(figures(at)["engine_hit_rates"])
    ratio = [y for y in hit["engine prefix-cache hit ratio"]["y"] if y is not None]
    assert ratio and all(0.8 < y < 1.0 for y in ratio)  # hits/queries summed over ranks, not a sum of ratios


def test_engine_page_at_a_moment_from_a_link(db_url: str, fill_now: float) -> None:
    moment = int(fill_now - 1800 + 30)  # 30 s after the collapse began; alerts fired 30 s and 90 s later
    at = app("engine", engine="a", at=str(moment), range="15m")
    text = texts(at).replace("\\", "")  # undo the markdown escaping
    assert "Showing the moment" in text
    # The state AT that time, from what was stored then: no collapse alert yet, thin reuse already.
    assert "State at" in text and "THIN-REUSE" in text and "COLLAPSED" not in text
    assert "sidecar warning" not in text  # the sidecar's current warnings belong to now
    fig = figures(at)["engine_hit_rates"]
    x = traces(fig)["R_t (token-weighted)"]["x"]
    first, last = pd.Timestamp(x[0]).timestamp(), pd.Timestamp(x[-1]).timestamp()
    assert moment - 460 < first and last < moment + 460  # centred on the moment, not live
    marks = [s for s in fig["layout"]["shapes"] if s.get("line", {}).get("width") == 2 and s["x0"] == s["x1"]]
    assert len(marks) == 1 and abs(pd.Timestamp(marks[0]["x0"]).timestamp() - moment) < 1
    at.button(key="engine_back_live").click().run()
    assert "at" not in at.query_params


def test_engine_page_time_range_up_to_seven_days(db_url: str) -> None:
    at = app("engine", engine="a", range="7d")
    assert at.segmented_control(key="engine_range").value == "7d"
    x = traces(figures(at)["engine_hit_rates"])["R_t (token-weighted)"]["x"]
    span = pd.Timestamp(x[-1]) - pd.Timestamp(x[0])
    assert span.total_seconds() > 36 * 3600  # the fill holds two days of rollups


def test_one_time_range_shared_by_the_pages_and_pausable(db_url: str) -> None:
    at = app()
    at.segmented_control(key="overview_range").set_value("6h").run()
    assert at.query_params["range"] == "6h"
    del at.query_params["range"]  # the next page opens without it in its URL
    at.switch_page("pages/engine.py").run()
    assert at.segmented_control(key="engine_range").value == "6h"  # follows the Overview's choice
    at.toggle(key="engine_live").set_value(False).run()
    paused_to = at.query_params["to"]
    assert "Paused at" in texts(at)
    at.run()
    assert at.query_params["to"] == paused_to  # frozen, not moving with time
    at.segmented_control(key="engine_range").set_value("custom").run()
    assert at.query_params["range"] == "custom" and "from" in at.query_params


def test_unknown_engine_in_the_link_says_so(db_url: str) -> None:
    at = app("engine", engine="zz")
    assert "Engine zz is not known" in texts(at)
    assert at.selectbox(key="engine_select").value == "a"


def test_sessions_table_filters_and_shows_ids_as_text(db_url: str) -> None:
    at = app("sessions", engine="a")
    table = at.dataframe[0].value
    assert len(table) == 30
    assert NASTY_SESSION in set(table["session"])
    parked = table[table["state"] == "parked"]
    assert set(parked["parked by"]) == {"operator", "budgeter"}
    at.multiselect(key="sessions_state_filter").set_value(["parked"]).run()
    assert set(at.dataframe[0].value["state"]) == {"parked"}
    at.text_input(key="sessions_id_filter").input("agent-00").run()
    assert set(at.dataframe[0].value["session"]) == {f"agent-00{i}" for i in range(6)}


def test_compaction_page_shows_regime_subtrees_and_decisions(db_url: str) -> None:
    at = app("compaction", engine="a")
    assert at.metric[0].value == "thin-reuse"
    assert "Deferred by an operator" in texts(at)
    subtrees = at.dataframe[0].value
    assert list(subtrees["subtree"])[0] == "system-prompt-0"  # hottest first
    assert list(subtrees["tokens"])[0] == "6,000"
    decisions = at.dataframe[1].value
    assert set(decisions["decision"]) == {"granted", "deferred"}
    assert "thin-reuse regime" in " ".join(decisions["reason"])


def test_compaction_page_says_a_subtree_length_is_not_reported(db_url: str) -> None:
    """The sidecar's GET /subtrees carries no length (the real-engine demo showed "None" in the column)."""
    from sqlalchemy import update

    from db import make_engine
    from db.models import Subtree

    with make_engine(db_url).begin() as conn:
        conn.execute(update(Subtree).values(tokens=None))
    subtrees = app("compaction", engine="a").dataframe[0].value
    assert set(subtrees["tokens"]) == {"not reported"}


def test_alerts_page_lists_firing_alerts_with_links(db_url: str) -> None:
    at = app("alerts")
    assert "Firing (3)" in texts(at)
    links = [link for link in at.get("page_link") if "Engine view" in link.proto.label]
    assert len(links) == 3
    assert any("at=" in link.proto.query_string and "engine=a" in link.proto.query_string for link in links)
    recent = at.dataframe[0].value
    assert "resolved" in set(recent["state"])


def test_audit_page_filters_and_exports_csv(db_url: str) -> None:
    at = app("audit", range="24h")
    table = at.dataframe[0].value
    assert {"sidecar", "dashboard"} <= set(table["source"])
    at.text_input(key="audit_actor").input("bob").run()
    table = at.dataframe[0].value
    assert set(table["who"]) == {"bob"}
    assert '"low": 0.75' in table.iloc[0]["before"]
    at.segmented_control(key="audit_range").set_value("1h").run()
    assert at.dataframe[0].value.empty  # bob acted three hours ago


def test_audit_csv_cannot_inject_formulas() -> None:
    data = csv_safe(pd.DataFrame({"session": ["=HYPERLINK(1)", "ok", "-1+2"]}))
    assert pd.read_csv(io.BytesIO(data))["session"].tolist() == ["'=HYPERLINK(1)", "ok", "'-1+2"]


def test_engine_page_shows_missed_tokens_by_cause_and_sessions_page_the_worst_sessions(db_url: str) -> None:
    at = app("engine", engine="a")
    assert not at.exception
    misses = traces(figures(at)["engine_misses"])
    assert {"cold", "evicted-parked", "prefix-changed", "unattributed"} <= set(misses)
    assert sum(misses["evicted-parked"]["y"]) > 0 and "new" not in misses
    assert "hits counted for recomputation" in misses  # engine a preempts
    assert "missed prompt tokens in this window" in texts(at)
    at = app("sessions", engine="a")
    assert not at.exception
    table = next(d.value for d in at.dataframe if "missed tokens" in d.value.columns)
    assert table["missed tokens"].is_monotonic_decreasing and len(table) == 12
    assert table.iloc[0]["session"].startswith("agent-")


def test_no_recomputation_line_where_the_engine_never_preempted(db_url: str) -> None:
    """Without preemption the engine's hits differ from the sidecar's cached tokens by timing alone (the
    engine counts at scheduling, the sidecar at completion), which is not recomputation (the real vLLM
    demo drew thousands of such tokens a bucket)."""
    from sqlalchemy import select, update

    from dashboard.misses import recomputation_buckets
    from db import make_engine
    from db.models import Sample, Series, Target

    assert recomputation_buckets({0.0: 5000.0, 30.0: 7000.0, 60.0: 90.0}, {30.0: 0.5, 60.0: 0.0}) == {
        30.0: 7000.0
    }
    with make_engine(db_url).begin() as conn:
        engine_a = select(Target.id).where(Target.name == "a", Target.role == "engine").scalar_subquery()
        series = select(Series.id).where(Series.target_id == engine_a, Series.signal == "preemptions_per_s")
        assert conn.execute(update(Sample).where(Sample.series_id.in_(series)).values(value=0.0)).rowcount > 0
    at = app("engine", engine="a")
    assert not at.exception
    misses = traces(figures(at)["engine_misses"])
    assert sum(misses["evicted-parked"]["y"]) > 0 and "hits counted for recomputation" not in misses


def test_budgeter_mode_has_a_row_of_its_own_and_demand_is_a_fraction_like_the_bands(db_url: str) -> None:
    """The mode is the only metric of its row (so "budgeter-park" is never cut to "budgeter…"), and demand
    is shown against the pool like the bands it is compared with."""
    at = app("budgeter", engine="a")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Mode"] == "budgeter-park"
    assert float(metrics["Demand / pool"]) == pytest.approx(0.99, abs=0.01)
    assert (metrics["Low band"], metrics["High band"], metrics["KV pool"]) == ("0.75", "0.95", "400K")
    assert not any(m.label == "Mode" for block in at.columns for m in block.get("metric")), (
        "the mode shares a row with other metrics again"
    )
