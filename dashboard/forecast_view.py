"""The Budgeter page's "Preview the next N minutes": the forecast (issue 16 item 3) as a background job.

Reads what the collectors stored of the engine (its sidecar's sessions and turn
trace, the engine's latency signals, the pool in the sidecar's state) and,
where ``PREFIXOPS_FIT`` names a ``simulator fit`` file *of this engine* (its
``engine`` URL is the engine's), the fitted cost model; builds the inputs with
``simulator.forecast`` and runs ``simulator.forecast_run`` under the current
and the proposed budgeter config in a thread started from the page. An
``st.fragment`` polls the job every second and shows its progress, then the two
runs side by side.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from core.budgeter import BudgeterConfig
from dashboard import data
from dashboard.frames import EngineRef
from dashboard.settings import Settings
from dashboard.ui import escape_md
from db.queries.turns import engine_block_size
from db.queries.turns import turns as stored_turns
from simulator.forecast import (
    OVERHEAD_TURNS,
    START_STATES,
    WINDOW_S,
    ForecastError,
    ForecastInputs,
    forecast_inputs,
)
from simulator.forecast_cost import COST_WINDOW_S
from simulator.forecast_draws import draws_for, run_draws

LATENCY_SIGNALS = (  # what `simulator.forecast_cost.cost_from_latencies` and `turn_overhead` read
    "itl_mean",
    "decode_time_mean",
    "output_len_mean",
    "itl_p50",
    "decode_time_p50",
    "output_len_p50",
    "e2e_p50",
    "ttft_p50",
    "kv_usage",
    "requests_running",
    "prompt_len_p50",
    "prefix_cache_queries_per_s",
    "prefix_cache_hits_per_s",
    "prompt_tokens_per_s",
    "cached_tokens_per_s",
)
# what `turn_overhead` pairs with the turns: the engine's exact mean, its median where there is no mean,
# and a gauge of every scrape (each sample's time bounds an interval, whether or not a request finished)
OVERHEAD_SIGNALS = ("e2e_mean", "e2e_p50", "kv_usage")
OVERHEAD_BASIS = {  # the caption's words for `ForecastInputs.turn_overhead_from`
    "e2e_mean": f"against its exact mean latency, over the newest {OVERHEAD_TURNS} turns",
    "e2e_p50": f"against its median latency, inside histogram buckets: coarse; the newest {OVERHEAD_TURNS} turns",
    "none": "no engine latency to compare with",
}
COST_POINTS = 4000
ROWS = (
    ("R_t (whole run)", "r_t"),
    ("R_t (last 5 min)", "r_t_last_5min"),
    ("turns/s", "turns_per_s"),
    ("p95 turn latency (s)", "p95_turn_latency_s"),
    ("parked sessions (mean)", "parked_mean"),
    ("parked sessions (end)", "parked_end"),
    ("parked sessions (max)", "parked_max"),
    ("time parked (session-minutes)", "parked_session_minutes"),
    ("waiting (end)", "waiting_end"),
    ("new sessions", "sessions_arrived"),
)


@dataclass
class Job:
    inputs: ForecastInputs
    configs: tuple[BudgeterConfig, BudgeterConfig]
    minutes: float
    seed: int = 0
    draws: int = 1  # per config: the results are their median and range (`simulator.forecast_draws`)
    progress: float = 0.0
    results: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None
    counted: dict[str, int] | None = None  # the sidecar's own backlog counts at the start (`start_note`)

    def start(self) -> Job:
        self.started = time.time()
        threading.Thread(target=self._run, name="forecast", daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            for i, cfg in enumerate(self.configs):
                self.results.append(
                    run_draws(
                        self.inputs,
                        cfg,
                        self.minutes,
                        self.seed,
                        self.draws,
                        progress=lambda p, i=i: setattr(self, "progress", (i + p) / 2),
                    )
                )
        except Exception as exc:  # shown on the page; the thread must not die silently
            self.error = f"{type(exc).__name__}: {exc}"
        self.finished = time.time()


NO_FIT_WARNING = (
    "without a fit the attention cost of long contexts is folded into the prefill cost, so a recovery "
    "runs fast here (on the validation, up to ~20% more turns/s): fit the engine with `python -m "
    "simulator fit` and name the file in PREFIXOPS_FIT"
)


def start_note(job: Job) -> str:
    """Where the start state (the collectors' listing of the sidecar's sessions) disagrees with the
    sidecar's own backlog counts of the same moment: a listing not caught up (a page of it cut short, a
    sidecar restarted), so the preview starts from fewer or other sessions than the engine has. Empty
    when they agree or the counts are unknown."""
    if not job.counted:
        return ""
    listed = collections.Counter(s.state for s in job.inputs.sessions)
    if all(listed[k] == v for k, v in job.counted.items()):
        return ""
    said = ", ".join(f"{v} {k}" for k, v in job.counted.items())
    held = ", ".join(f"{listed[k]} {k}" for k in job.counted)
    return (
        f"The preview starts from the collectors' listing of the sidecar's sessions: {held}. The sidecar "
        f"itself counts {said}. The listing has not caught up, so the preview does not start from the "
        "engine's whole backlog."
    )


def caption(job: Job, note: str) -> str:
    """What the forecast ran on, under its table: start, workload, engine, overhead and cost model."""
    i, sh = job.inputs, job.inputs.shapes
    cost = f"cost model from {i.cost_source} ({note}"
    if i.cost_estimated:
        cost += f"; {', '.join(i.cost_estimated)} from the recorded latencies"
    cost += ")"
    if i.cost_source == "latencies":
        cost += f"; {NO_FIT_WARNING}"
    ran = f"; ran in {job.finished - job.started:.1f} s." if job.finished is not None else "."
    draws = (
        f"the median of {job.draws} draws of new sessions and turns (their range in brackets); "
        if job.draws > 1
        else "one draw of new sessions and turns; "
    )
    return (
        f"{job.minutes:g} minutes from {len(i.sessions)} sessions as of now, {draws}new sessions at "
        f"{sh.arrival_rate * 60:.2f}/min and turn shapes from {sh.turns_seen} recorded turns; pool "
        f"{i.engine.pool_tokens} tokens in blocks of {i.engine.block_size}; "
        f"{i.turn_overhead_s:.2f} s of each turn's recorded latency outside the engine's own "
        f"({OVERHEAD_BASIS.get(i.turn_overhead_from, i.turn_overhead_from)}); {cost}{ran}"
    )


def turn_rows(url: str, sidecar_id: int, since: float) -> list[dict[str, Any]]:
    """The sidecar's stored turns since ``since`` (``db.queries.turns``), keyed as `simulator.forecast` reads them."""
    found = data._read(url, stored_turns, target_id=sidecar_id, start_ts=since)
    return [{**r, "id": r["remote_id"], "session": r["session_id"]} for r in found]


def latency_samples(
    url: str, engine_id: int | None, start: float, end: float, signals: tuple[str, ...] = LATENCY_SIGNALS
) -> list[dict[str, Any]]:
    if engine_id is None:
        return []
    # as fine as stored: each interval is a point of the cost model's regression (raw samples for hours)
    frame = data.series(url, (engine_id,), signals, start, end, max_points=COST_POINTS)
    if frame.empty:
        return []
    wide = frame.pivot_table(index=["ts", "engine_label"], columns="signal", values="value", aggfunc="last")
    wide = wide.reset_index(level="ts")  # `ts` too: the turn overhead pairs intervals with the turns in them
    return [{k: v for k, v in row.items() if pd.notna(v)} for row in wide.to_dict("records")]


def block_size(url: str, engine_id: int | None) -> int | None:
    """The engine's KV block size as the collectors recorded it (``db.queries.turns.engine_block_size``)."""
    return data._read(url, engine_block_size, engine_id) if engine_id is not None else None


def _fit_files(spec: str) -> list[Path]:
    out: list[Path] = []
    for part in filter(None, spec.split(os.pathsep)):
        p = Path(part)
        out.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    return out


def fit_of(path: str | None, engine_url: str | None) -> tuple[dict[str, Any] | None, str]:
    """The ``set`` of the fit file of this engine among ``PREFIXOPS_FIT``, and a note on it.

    ``PREFIXOPS_FIT`` is a `simulator fit` file, a directory of them (``*.json``), or several of either
    separated by ``os.pathsep``; a file is this engine's when its ``engine`` URL is the engine's.
    """
    if not path:
        return None, "no fit file (PREFIXOPS_FIT unset)"
    files = _fit_files(path)
    notes = []
    for file in files:
        try:
            doc = json.loads(file.read_text())
            values, engine = doc["set"], str(doc.get("engine") or "")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            notes.append(f"PREFIXOPS_FIT={file} is not a `simulator fit` file ({exc})")
            continue
        if engine_url and engine.rstrip("/") == engine_url.rstrip("/"):
            return values, f"fit file {file}"
        notes.append(f"the fit file {file} is of {engine or 'an unnamed engine'}, not {engine_url}")
    return None, "; ".join(notes) or f"PREFIXOPS_FIT={path}: no fit file there"


def start(
    settings: Settings,
    ref: EngineRef,
    state: dict[str, Any],
    sessions: pd.DataFrame,
    current: BudgeterConfig,
    proposed: BudgeterConfig,
    minutes: float,
    now: float,
    begin: bool = True,
    backlog: Mapping[str, Any] | None = None,
) -> tuple[Job | None, str]:
    """The forecast job of ``current`` against ``proposed`` from the collectors' record as of ``now``: its
    inputs read at once, its draws run in the background from here (``begin``) or from ``Job.start``.
    ``backlog``: the sidecar's ``/state`` backlog counts of the same moment, for `start_note`."""
    url = settings.database_url
    fit, note = fit_of(settings.fit_path, ref.engine_url)
    try:
        inputs = forecast_inputs(
            pool_tokens=state.get("pool_tokens"),
            session_rows=sessions.to_dict("records"),
            turn_rows=turn_rows(url, ref.sidecar_target_id, now - 2 * WINDOW_S)
            if ref.sidecar_target_id
            else [],
            latency_samples=latency_samples(url, ref.engine_target_id, now - COST_WINDOW_S, now),
            fit=fit,
            current=current,
            now=now,
            block_size=block_size(url, ref.engine_target_id),
            # the turn overhead pairs each engine interval with the turns finished in it: as recorded,
            # over the workload window (the cost model's 6 hours come averaged into coarser points)
            e2e_samples=latency_samples(url, ref.engine_target_id, now - WINDOW_S, now, OVERHEAD_SIGNALS),
        )
    except (ForecastError, data.DatabaseUnavailable) as exc:
        return None, str(exc)
    counted = {
        k: int(v)
        for k in START_STATES
        if isinstance(v := (backlog or {}).get(k), int | float) and not isinstance(v, bool)
    }
    job = Job(inputs, (current, proposed), minutes, draws=draws_for(minutes), counted=counted or None)
    return (job.start() if begin else job), note


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def cell(result: dict[str, Any], key: str) -> str:
    """A table cell: the draws' median, and their range when they differ."""
    value = _fmt(result["summary"].get(key))
    low, high = result.get("spread", {}).get(key, (None, None))
    return value if low == high else f"{value} ({_fmt(low)}–{_fmt(high)})"


def _label(cfg: BudgeterConfig) -> str:
    return f"{cfg.mode} {cfg.low:.2f}-{cfg.high:.2f}"


def section(
    settings: Settings,
    ref: EngineRef,
    state: dict[str, Any],
    sessions: pd.DataFrame,
    current: BudgeterConfig,
    proposed: BudgeterConfig | None,
    now: float,
    backlog: Mapping[str, Any] | None = None,
) -> None:
    st.subheader("Preview the next N minutes")
    key = f"forecast_job_{ref.key}"
    cols = st.columns([1, 3])
    minutes = cols[0].number_input(
        "Minutes", min_value=5, max_value=360, value=30, step=5, key="forecast_minutes"
    )
    cols[1].caption(
        "Runs the engine's sessions as of now, and new ones drawn from the last 30 minutes of turns, "
        "through the simulator under the current and the proposed mode and bands. The simulator knows "
        "only what the collectors know of this engine: its pool and its cost model."
    )
    if cols[0].button("Run forecast", key="forecast_run", disabled=proposed is None):
        assert proposed is not None
        job, note = start(
            settings, ref, state, sessions, current, proposed, float(minutes), now, backlog=backlog
        )
        if job is None:
            st.warning(escape_md(f"No forecast: {note}"))
        st.session_state[key] = job
        st.session_state[key + "_note"] = note
    job = st.session_state.get(key)
    running = isinstance(job, Job) and job.finished is None

    @st.fragment(run_every=1.0 if running else None)
    def show() -> None:
        job = st.session_state.get(key)
        if not isinstance(job, Job):
            return
        if job.finished is None:
            st.progress(
                min(1.0, job.progress), text=f"Forecasting {job.minutes:g} minutes… {job.progress:.0%}"
            )
            return
        if running:  # this fragment polls; finished: one whole-page run to show the result and stop polling
            st.rerun()
        if job.error:
            st.error(escape_md(f"The forecast failed: {job.error}"))
            return
        if behind := start_note(job):  # its own box: a start the engine does not have misleads every row
            st.warning(escape_md(behind))
        st.caption(escape_md(caption(job, st.session_state.get(key + "_note", ""))))
        a, b = job.results
        table = pd.DataFrame(
            {
                "": [name for name, _ in ROWS],
                f"current: {_label(job.configs[0])}": [cell(a, k) for _, k in ROWS],
                f"proposed: {_label(job.configs[1])}": [cell(b, k) for _, k in ROWS],
            }
        )
        st.dataframe(table, hide_index=True, key="forecast_table")
        per_min = {}
        for name, r in zip(("current", "proposed"), job.results, strict=True):
            s = r["series"]
            n = len(s["prompt_tokens"]) // 60
            per_min[name] = [
                sum(s["cached_tokens"][m * 60 : (m + 1) * 60]) / p
                if (p := sum(s["prompt_tokens"][m * 60 : (m + 1) * 60]))
                else None
                for m in range(n)
            ]
        st.line_chart(
            pd.DataFrame(per_min, index=pd.RangeIndex(1, len(per_min["current"]) + 1, name="minute")),
            y_label="R_t per minute",
        )

    show()
