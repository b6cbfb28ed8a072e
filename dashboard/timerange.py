"""The one time-range control every page shares: a range (15m ... 30d, or custom), live or paused,
and the moment of a link ("at that moment").

State lives in the URL (``?range=1h``, ``&from=<epoch>&to=<epoch>`` for a custom range or a paused
view, ``&at=<epoch>`` for a moment from an alert) and in the session, so the range chosen on one
page is the default of the next (the Engine page opens on the Overview's range). `DEFAULT_RANGE`
is the one default.

- **live**: the window ends now and moves; panels refresh.
- **paused**: the window is frozen where it was when paused (``to``); nothing refreshes.
- **custom**: ``from``/``to`` chosen with the date-time inputs (UTC); not live.
- **at**: a moment from a link; the window is centred on it, the moment is marked, the page shows
  the state *at* that time; "Back to live" leaves it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import streamlit as st

from dashboard.settings import Settings

RANGES: dict[str, float] = {
    "15m": 900.0,
    "1h": 3600.0,
    "6h": 6 * 3600.0,
    "24h": 86400.0,
    "7d": 7 * 86400.0,
    "30d": 30 * 86400.0,
}
CUSTOM = "custom"
DEFAULT_RANGE = "1h"
SHARED_KEY = "shared_time_range"


@dataclass(frozen=True)
class TimeWindow:
    start: float
    end: float
    label: str
    at: float | None = None  # a moment chosen through a link
    live: bool = True

    @property
    def span(self) -> float:
        return self.end - self.start

    def moving(self, now: float) -> TimeWindow:
        """The same window re-evaluated at `now` (only a live window moves)."""
        if not self.live:
            return self
        return TimeWindow(now - self.span, now, self.label, None, True)


def _epoch(raw: str | None) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def live_end(settings: Settings, now: float | None = None) -> float:
    """Now, rounded up to the refresh interval so concurrent panels share cached queries."""
    step = max(settings.refresh_seconds, 0.5)
    return math.ceil((time.time() if now is None else now) / step) * step


def resolve(
    params: dict[str, str], shared: dict[str, object], now: float, default: str = DEFAULT_RANGE
) -> TimeWindow:
    """The window the URL (then the session's last choice, then `default`) asks for at `now`. Pure."""
    label = params.get("range") or str(shared.get("range") or default)
    if label not in RANGES and label != CUSTOM:
        label = DEFAULT_RANGE
    at = _epoch(params.get("at"))
    start_p, end_p = _epoch(params.get("from")), _epoch(params.get("to"))
    if at is not None:
        span = RANGES.get(label, RANGES[DEFAULT_RANGE])
        return TimeWindow(
            at - span / 2, at + span / 2, label if label in RANGES else DEFAULT_RANGE, at, False
        )
    if label == CUSTOM:
        if start_p is not None and end_p is not None and start_p < end_p:
            return TimeWindow(start_p, end_p, CUSTOM, None, False)
        span = RANGES[DEFAULT_RANGE]
        return TimeWindow(now - span, now, CUSTOM, None, False)
    span = RANGES[label]
    if end_p is not None:  # paused
        return TimeWindow(end_p - span, end_p, label, None, False)
    return TimeWindow(now - span, now, label, None, True)


def _set_params(**values: str | None) -> None:
    for name, value in values.items():
        if value is None:
            st.query_params.pop(name, None)
        elif st.query_params.get(name) != value:
            st.query_params[name] = value


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)


def time_control(settings: Settings, *, key: str, default: str = DEFAULT_RANGE) -> TimeWindow:
    """Draw the control (one row) and return the window; `key` is unique per page. `default` applies only
    until a range is chosen on any page (the Audit page opens on a day)."""
    shared: dict[str, object] = st.session_state.setdefault(SHARED_KEY, {})
    params = {k: st.query_params.get(k) for k in ("range", "from", "to", "at")}
    now = live_end(settings)
    window = resolve({k: v for k, v in params.items() if v is not None}, shared, now, default)
    if window.at is not None:
        cols = st.columns([5, 1])
        cols[0].info(
            f"Showing the moment {_utc(window.at):%Y-%m-%d %H:%M:%S} UTC (from a link, marked on the "
            f"charts) in a {window.label} window centred on it: the state at that time, not live."
        )
        if cols[1].button("Back to live", key=f"{key}_back_live"):
            _set_params(at=None, **{"from": None, "to": None})
            st.rerun()
        return window
    cols = st.columns([7, 2])
    options = [*RANGES, CUSTOM]
    chosen = (
        cols[0].segmented_control(
            "Time range",
            options,
            default=window.label,
            key=f"{key}_range",
            format_func=lambda v: v if v == CUSTOM else f"last {v}",
        )
        or window.label
    )
    live = cols[1].toggle(
        "Live",
        value=window.live and chosen != CUSTOM,
        key=f"{key}_live",
        disabled=chosen == CUSTOM,
        help="off: pause the view where it is (nothing refreshes)",
    )
    if chosen == CUSTOM:
        row = st.columns(2)
        start = row[0].datetime_input("From (UTC)", value=_utc(window.start), key=f"{key}_from")
        end = row[1].datetime_input("To (UTC)", value=_utc(window.end), key=f"{key}_to")
        s_ts, e_ts = start.replace(tzinfo=UTC).timestamp(), end.replace(tzinfo=UTC).timestamp()
        if e_ts <= s_ts:
            st.warning("The custom range ends before it starts; showing the last hour instead.")
            s_ts, e_ts = now - RANGES[DEFAULT_RANGE], now
        _set_params(range=CUSTOM, **{"from": f"{s_ts:.0f}", "to": f"{e_ts:.0f}"})
        shared["range"] = CUSTOM
        return TimeWindow(s_ts, e_ts, CUSTOM, None, False)
    span = RANGES[chosen]
    if (
        params.get("range") or chosen != window.label
    ):  # a choice (not a page's default) follows to other pages
        shared["range"] = chosen
    if live:
        _set_params(range=chosen, **{"from": None, "to": None})
        return TimeWindow(now - span, now, chosen, None, True)
    end_ts = window.end if not window.live and window.label != CUSTOM else now
    _set_params(range=chosen, **{"from": None, "to": f"{end_ts:.0f}"})
    cols[1].caption(f"Paused at {_utc(end_ts):%H:%M:%S} UTC")
    return TimeWindow(end_ts - span, end_ts, chosen, None, False)
