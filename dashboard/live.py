"""Live panels whose refresh never restarts a run that has not finished, at any load.

A live panel is an ``st.fragment`` the browser reruns on a timer (``run_every``). Streamlit queues a
timer tick that comes while the panel is still running and starts it the moment the run ends, so a
panel whose run takes longer than the interval (the Engine page at load ~30: 0.5 s of CPU, 5-7 s of
wall time) runs back to back for ever: the server never idles, and the browser is sent a new set of
figures (~0.5 MB on the Engine page) before it has drawn the last, so the charts stayed blank
skeletons. Here the interval adapts to the measured run time:

- `next_interval(refresh, recent)`: the configured refresh (`PREFIXOPS_REFRESH_SECONDS`), or
  `HEADROOM` x the slowest of the last `WINDOW` runs' wall times when that is longer, rounded up to
  a whole second, at most `MAX_INTERVAL`. Pure.
- `live_panel(name, settings, live, body)`: runs ``body`` in a fragment refreshing at that interval;
  after each run it records the run's wall time (per browser session, and per page for the first
  run of a new session) and, when the interval changes, re-sets the browser's timer (the fragment's
  own auto-rerun message with the new interval: the frontend replaces a fragment's timer when the
  interval differs). A caption says when the page refreshes slower than configured, and why.

So the server is idle at least half the time, the browser gets a new set of figures at most every
interval and draws each one, and the refresh is back at the configured interval once runs are fast.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

import streamlit as st

from dashboard.settings import Settings

HEADROOM = 2.0  # interval / run time: the server idles at least half of the time
WINDOW = 3  # runs whose slowest wall time sets the interval
MAX_INTERVAL = 60.0  # seconds; a page slower than this still refreshes once a minute
_STATE = "live_panel_runs"
_recent_by_page: dict[str, list[float]] = {}  # process-wide: a new session's first guess
_lock = threading.Lock()
_clock = time.perf_counter  # the run timer (tests set a clock of their own)


def next_interval(refresh: float, recent: Sequence[float]) -> float:
    """Seconds between refreshes: ``refresh``, or ``HEADROOM`` x the slowest of the last ``WINDOW``
    run times (seconds) rounded up to a whole second when longer; at most ``MAX_INTERVAL``
    (never below ``refresh``)."""
    slowest = max(recent[-WINDOW:], default=0.0)
    wanted = math.ceil(HEADROOM * slowest) if slowest > 0 else 0.0
    return max(refresh, min(float(wanted), MAX_INTERVAL))


def interval_for(name: str, settings: Settings) -> float:
    """The interval a panel starts at: from this session's runs, else the page's last runs in this
    process (another session's), else the configured refresh."""
    runs = st.session_state.get(_STATE, {}).get(name)
    if runs is None:
        with _lock:
            runs = list(_recent_by_page.get(name, []))
    return next_interval(settings.refresh_seconds, runs)


def _record(name: str, seconds: float) -> list[float]:
    runs: dict[str, list[float]] = st.session_state.setdefault(_STATE, {})
    mine = (runs.get(name, []) + [seconds])[-WINDOW:]
    runs[name] = mine
    with _lock:
        _recent_by_page[name] = mine
    return mine


def _set_browser_timer(interval: float) -> None:
    """Re-set the running fragment's refresh timer in the browser (the message st.fragment sends)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from streamlit.runtime.scriptrunner_utils.script_run_context import ThreadState, get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    fragment_id = ThreadState.get().fragment_id if ctx is not None else None
    if ctx is None or not fragment_id:
        return
    msg = ForwardMsg()
    msg.auto_rerun.interval = interval
    msg.auto_rerun.fragment_id = fragment_id
    ctx.enqueue(msg)


def live_panel(name: str, settings: Settings, live: bool, body: Callable[[], None]) -> None:
    """Run ``body`` as a panel that refreshes while ``live`` at the adaptive interval (`next_interval`).

    ``name`` is unique per page. A paused panel (``live`` False) runs once and does not refresh."""
    start_interval = interval_for(name, settings) if live else None

    @st.fragment(run_every=start_interval)
    def panel() -> None:
        in_force = st.session_state.setdefault("live_panel_interval", {}).get(name, start_interval)
        started = _clock()
        body()
        if not live:
            return
        took = _clock() - started
        interval = next_interval(settings.refresh_seconds, _record(name, took))
        if interval != in_force:
            st.session_state["live_panel_interval"][name] = interval
            _set_browser_timer(interval)
        if interval > settings.refresh_seconds:
            st.caption(
                f"Refreshing every {interval:g} s instead of {settings.refresh_seconds:g} s: this page took "
                f"{took:.1f} s to draw (the server is busy), and a refresh never restarts a draw that has "
                "not finished."
            )

    st.session_state.setdefault("live_panel_interval", {})[name] = start_interval
    panel()
