"""Overview (fleet): counts by state, engines worst first with the cause and next step, the queue at the
sidecars, and fleet charts as distributions across engines with the worst few on top."""

from __future__ import annotations

import time
from urllib.parse import quote

import pandas as pd
import streamlit as st

from dashboard import asof, data, fleet, live, risk
from dashboard import fleet_charts as fc
from dashboard import frames as q
from dashboard.settings import Settings
from dashboard.status import BADGE, COLOR, STATES, collectors_alive
from dashboard.timerange import TimeWindow, time_control
from dashboard.ui import admission_wait_limit, ensure_router, escape_md, fmt_ts, require_database

ensure_router()
settings = Settings.from_env()
st.title("Overview")
require_database(settings)
url = settings.database_url
ATTENTION_SHOWN = 8
FLEET_POINTS = 150  # per engine and chart: distributions need the shape, not every sample
WORST_N = 3
# every number column: numeric (sorts as numbers), an unknown value a blank cell (help: what a blank means)
NUMBER_COLUMNS = {**fleet.NUMBER_COLUMNS, "risk": ("%.2f", risk.RISK_HELP)}

window = time_control(settings, key="overview")
name_filter = st.text_input(
    "Filter engines by name or label", key="overview_filter", placeholder="e.g. engine-1 or cluster=eu"
)


def fleet_state(now: float, at: float | None = None) -> list[dict]:
    """The fleet now, or (paused: `at`) as of `at` from the stored history (`dashboard.asof`)."""
    engines = [e for e in data.engines(url) if fleet.matches(e, name_filter)]
    health = data.health(url, at)
    if at is None:
        last_beat = max((b["last_beat_ts"] for b in data.heartbeats(url)), default=None)
    else:
        last_beat, now = asof.last_scrape(health), at
    all_ids = tuple(sorted({t for e in engines for t in e.target_ids}))
    latest = data.latest(url, all_ids, None, at)
    alerts = data.alerts(url, now - 86400, at)
    if at is not None:
        alerts = q.firing_at(alerts, at)
    firing: dict[int, set[str]] = {}
    if not alerts.empty:
        for row in alerts[alerts["state"] == "firing"].itertuples():
            if pd.notna(row.target_id):
                firing.setdefault(int(row.target_id), set()).add(row.rule)
    rows = fleet.fleet_rows(
        engines,
        health=health,
        latest=latest,
        states=data.sidecar_states(url)
        if at is None
        else asof.sidecar_states_at(latest, (e.sidecar_target_id for e in engines)),
        firing=firing,
        now=now,
        stale_after=settings.stale_after_seconds,
        collectors_ok=collectors_alive(last_beat, now, settings.heartbeat_stale_seconds),
        collectors_age=None if last_beat is None else now - last_beat,
        admission_wait_s=admission_wait_limit(),
    )
    risk.add_columns(rows, latest)
    return fleet.sort_rows(rows)


def render_table(rows: list[dict]) -> None:
    table = pd.DataFrame([{k: v for k, v in r.items() if k not in ("ref", "status")} for r in rows])
    table = fleet.table_numbers(table, NUMBER_COLUMNS)
    table["oldest wait"] = [_secs(v) for v in table["oldest wait"]]
    table["oldest parked"] = [_secs(v) for v in table["oldest parked"]]
    table.insert(0, "open", [f"engine?engine={quote(r['engine'])}" for r in rows])
    styled = table.style.map(
        lambda v: f"background-color: {COLOR.get(v, '')}; font-weight: 600", subset=["state"]
    )
    old = {"DOWN", "STALE"}
    styled = styled.apply(
        lambda row: [
            "color: #9e9e9e; font-style: italic" if row["state"] in old and col in NUMBER_COLUMNS else ""
            for col in row.index
        ],
        axis=1,
    )
    config = {
        name: st.column_config.NumberColumn(name, help=help_text, format=fleet.column_format(fmt))
        for name, (fmt, help_text) in NUMBER_COLUMNS.items()
    }
    config.update(
        {
            "open": st.column_config.LinkColumn("open", display_text="Engine page", width="small"),
            "engine": st.column_config.TextColumn("engine", width="small"),
            "state": st.column_config.TextColumn(
                "state", width=110, help="precedence: " + " > ".join(STATES)
            ),
            "why": st.column_config.TextColumn("why", width="large", help="the cause and the next step"),
            "oldest wait": st.column_config.TextColumn(
                "oldest wait",
                help="oldest session waiting at the sidecar; blank: none waiting, or no sidecar",
                alignment="right",
            ),
            "oldest parked": st.column_config.TextColumn(
                "oldest parked",
                help="oldest session parked at the sidecar; blank: none parked, or no sidecar",
                alignment="right",
            ),
            "risk: leading inputs": st.column_config.TextColumn(
                "risk: leading inputs", help=risk.LEADING_HELP
            ),
        }
    )
    st.dataframe(
        styled,
        key="fleet_table",
        hide_index=True,
        width="stretch",
        column_config=config,
        placeholder="",  # an unknown number is a blank cell, not "None"
        height=min(38 + 35 * len(table), 740),
    )


def _secs(value: float | None) -> str:
    if value is None or value != value:
        return ""
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.0f} min"


def fleet_panel() -> None:
    now = time.time()
    at = asof.moment(window)
    try:
        rows = fleet_state(now, at)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))
        return
    if not rows:
        st.info(
            "No engines match the filter."
            if name_filter
            else "No engines recorded yet: the collectors have not scraped any target."
        )
        return
    counts = fleet.state_counts(rows)
    cols = st.columns(len(STATES))
    for col, state in zip(cols, STATES, strict=True):
        col.metric(BADGE[state], counts.get(state, 0))
    attention = [r for r in rows if r["status"].state not in ("healthy", "unknown")]
    if attention:
        st.markdown(f"**Needs attention ({len(attention)})**, worst first:")
        for r in attention[:ATTENTION_SHOWN]:
            line = st.columns([2, 2, 12])
            line[0].markdown(f"**{r['state']}**")
            line[1].page_link(
                "pages/engine.py", label=escape_md(r["engine"]), query_params={"engine": r["engine"]}
            )
            line[2].markdown(escape_md(r["why"]))
        if len(attention) > ATTENTION_SHOWN:
            st.caption(f"... and {len(attention) - ATTENTION_SHOWN} more in the table below.")
            with st.expander(f"All {len(attention)} needing attention, with the cause and next step in full"):
                st.text("\n".join(f"{r['state']:<11} {r['engine']}: {r['why']}" for r in attention))
    st.caption(
        (
            f"As of {time.strftime('%H:%M:%S', time.gmtime(now))} UTC; refreshes every "
            f"{live.interval_for('overview_fleet', settings):g} s."
            if at is None
            else f"As of {fmt_ts(at)} (paused): the samples, scrapes and alerts stored for that "
            "time, ages counted to then."
        )
        + " Sorted worst first (state, then lowest R_t). Numbers of a down or "
        "stale engine are its last known values (grey); a blank is a value not known (the column's help says why)."
    )
    render_table(rows)


def charts_for(window_now: TimeWindow, now: float) -> None:
    engines = [e for e in data.engines(url) if fleet.matches(e, name_filter)]
    if not engines:
        return
    start, end = window_now.start, window_now.end
    sidecars = {e.sidecar_target_id: e for e in engines if e.sidecar_target_id is not None}
    eng_ids = {e.engine_target_id: e for e in engines if e.engine_target_id is not None}
    side = data.series(
        url,
        tuple(sorted(sidecars)),
        ("token_weighted", "divergence", "demand_fraction", "waiting"),
        start,
        end,
        FLEET_POINTS,
    )
    eng = q.combine_ranks(data.series(url, tuple(sorted(eng_ids)), ("kv_usage",), start, end, FLEET_POINTS))
    at = asof.moment(window_now)
    health = data.health(url, at)
    frozen = {
        e.sidecar_target_id: health[e.engine_target_id].last_success_ts or 0.0
        for e in sidecars.values()
        if e.engine_target_id in health and not health[e.engine_target_id].up
    }
    side = fc.drop_frozen(side, frozen)
    latest = data.latest(
        url, tuple(sorted(sidecars)), ("token_weighted", "divergence", "demand_fraction", "waiting"), at
    )
    step = q.step_for_span(end - start)
    common = dict(
        start=start,
        end=end,
        now=now,
        stale_after=settings.stale_after_seconds,
        max_gap=max(10.0, 3 * max(step, (end - start) / FLEET_POINTS)),
        marker_ts=window_now.at,
        bucket_s=fc.bucket_seconds(start, end, FLEET_POINTS),
    )

    def worst(signal: str, highest: bool) -> list[tuple[int, str]]:
        known = [(tid, latest.value(tid, signal)) for tid in sidecars if tid not in frozen]
        known = [(tid, v) for tid, v in known if v is not None]
        known.sort(key=lambda x: -x[1] if highest else x[1])
        return [(tid, sidecars[tid].key) for tid, _v in known[:WORST_N]]

    st.plotly_chart(
        fc.distribution_figure(
            side,
            "token_weighted",
            worst("token_weighted", False),
            title="R_t across engines: p10-p90, median, the 3 lowest (UTC)",
            y_title="R_t",
            y_range=(0, 1.05),
            **common,
        ),
        key="overview_hit_rates",
        width="stretch",
    )
    left, right = st.columns(2)
    with left:
        st.plotly_chart(
            fc.distribution_figure(
                side,
                "divergence",
                worst("divergence", True),
                title="D = R_r - R_t: distribution, the 3 highest (UTC)",
                y_title="D",
                y_range=(-0.1, 1.0),
                threshold=settings.divergence_threshold,
                **common,
            ),
            key="overview_divergence",
            width="stretch",
        )
        st.plotly_chart(
            fc.distribution_figure(
                side,
                "waiting",
                worst("waiting", True),
                title="Sessions waiting at the sidecar: distribution, the 3 most (UTC)",
                y_title="sessions",
                tickformat="d",
                **common,
            ),
            key="overview_waiting",
            width="stretch",
        )
    with right:
        demand = side[side["signal"] == "demand_fraction"]["value"]
        peak = float(demand.max()) if len(demand) else 0.0
        st.plotly_chart(
            fc.distribution_figure(
                side,
                "demand_fraction",
                worst("demand_fraction", True),
                title="KV demand / pool: distribution, the 3 highest (UTC)",
                y_title="fraction of pool",
                y_range=(0, max(1.2, 1.05 * peak)),
                threshold=1.0,
                threshold_label="KV pool",
                tickformat=".0%",
                **common,
            ),
            key="overview_demand",
            width="stretch",
        )
        kv_latest = data.latest(url, tuple(sorted(eng_ids)), ("kv_usage",), at)
        kv_known = sorted(
            (
                (
                    max(
                        v
                        for v in (kv_latest.value(tid, "kv_usage", lab) for lab in kv_latest.labels(tid))
                        if v is not None
                    ),
                    tid,
                )
                for tid in eng_ids
                if kv_latest.labels(tid)
            ),
            reverse=True,
        )
        kv_worst = [(tid, eng_ids[tid].key) for _v, tid in kv_known[:WORST_N]]
        st.plotly_chart(
            fc.distribution_figure(
                eng,
                "kv_usage",
                kv_worst,
                title="Engine KV usage gauge: distribution, the 3 highest (UTC; "
                "excludes idle cached prefixes)",
                y_title="fraction",
                y_range=(0, 1.05),
                tickformat=".0%",
                **common,
            ),
            key="overview_kv",
            width="stretch",
        )
    st.caption(
        "Lines for each engine are on its Engine page. Points a sidecar reported after its engine stopped "
        "answering are left out (they are frozen, not current)."
    )


def charts_panel() -> None:
    now = time.time()
    try:
        charts_for(window.moving(data.live_now(settings)), now)
    except data.DatabaseUnavailable as exc:
        st.error(str(exc))


live.live_panel("overview_fleet", settings, True, fleet_panel)
st.subheader("Fleet charts")
live.live_panel("overview_charts", settings, window.live, charts_panel)
