"""Cached access to the database and the HTTP client, for the pages.

- `read_engine()` / `write_engine()`: one SQLAlchemy engine each per URL
  (`st.cache_resource`). Reads go through a read-only connection; the few
  writes (acknowledgements, silences, dashboard audit rows) through the other.
- Every query result is cached with `st.cache_data(ttl=...)` no longer than the
  refresh interval, keyed on plain arguments; live "now" is rounded to the
  refresh interval so panels refreshing together share one query.
- `http_client()`: one sync `httpx.Client` per process. Tests may set
  `transport_override` (an `httpx.MockTransport`) before running the app.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pandas as pd
import streamlit as st
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, ProgrammingError

from dashboard import frames as q
from dashboard.settings import Settings
from dashboard.timerange import live_end
from db import make_engine, sqlite_path

logger = logging.getLogger(__name__)

TTL = 2.0  # seconds; never longer than the fastest refresh interval
transport_override: httpx.BaseTransport | None = None


class DatabaseUnavailable(RuntimeError):
    """The database cannot be read (missing file, no schema yet, locked beyond the timeout)."""


def database_problem(url: str) -> str | None:
    """Why the database cannot be read at all, or None."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return (
            f"No database at {path}: the collectors create it on their first start "
            "(`python -m collectors`). Nothing to show yet."
        )
    return None


@st.cache_resource(show_spinner=False)
def read_engine(url: str) -> Engine:
    return make_engine(url, read_only=sqlite_path(url) is not None)


@st.cache_resource(show_spinner=False)
def write_engine(url: str) -> Engine:
    return make_engine(url)


@st.cache_resource(show_spinner=False)
def _shared_client() -> httpx.Client:
    return httpx.Client(timeout=5.0, follow_redirects=False)


def http_client() -> httpx.Client:
    if transport_override is not None:
        return httpx.Client(transport=transport_override, timeout=5.0)
    return _shared_client()


def live_now(settings: Settings) -> float:
    """Now, rounded up to the refresh interval so concurrent panels share cached queries."""
    return live_end(settings)


def _read(url: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        with read_engine(url).connect() as conn:
            return fn(conn, *args, **kwargs)
    except (OperationalError, ProgrammingError) as exc:
        logger.warning("database read failed: %s", exc.orig if hasattr(exc, "orig") else exc)
        raise DatabaseUnavailable(
            f"The database at {url.split('@')[-1]} cannot be read right now "
            f"({type(getattr(exc, 'orig', exc)).__name__}: {getattr(exc, 'orig', exc)}). "
            "If the collectors have never run, start them."
        ) from None


@st.cache_data(ttl=TTL, show_spinner=False)
def engines(url: str) -> list[q.EngineRef]:
    return _read(url, q.list_engines)


@st.cache_data(ttl=TTL, show_spinner=False)
def health(url: str, as_of: float | None = None) -> dict[int, q.TargetHealth]:
    return _read(url, q.target_health, as_of)


@st.cache_data(ttl=TTL, show_spinner=False)
def heartbeats(url: str) -> list[dict[str, Any]]:
    return _read(url, q.heartbeats)


@st.cache_data(ttl=TTL, show_spinner=False)
def latest(
    url: str,
    target_ids: tuple[int, ...],
    signals: tuple[str, ...] | None = None,
    as_of: float | None = None,
) -> q.Latest:
    return _read(url, q.latest, target_ids, signals, as_of)


@st.cache_data(ttl=TTL, show_spinner=False)
def series(
    url: str,
    target_ids: tuple[int, ...],
    signals: tuple[str, ...],
    start: float,
    end: float,
    max_points: int | None = None,
) -> pd.DataFrame:
    return _read(url, q.series_frame, target_ids, signals, start, end, max_points)


@st.cache_data(ttl=TTL, show_spinner=False)
def sidecar_states(url: str) -> dict[int, dict[str, Any]]:
    return _read(url, q.sidecar_states)


@st.cache_data(ttl=TTL, show_spinner=False)
def sessions(url: str, sidecar_ids: tuple[int, ...]) -> pd.DataFrame:
    return _read(url, q.sessions_frame, sidecar_ids)


@st.cache_data(ttl=TTL, show_spinner=False)
def subtrees(url: str, sidecar_ids: tuple[int, ...]) -> pd.DataFrame:
    return _read(url, q.subtrees_frame, sidecar_ids)


@st.cache_data(ttl=TTL, show_spinner=False)
def decisions(url: str, sidecar_ids: tuple[int, ...], start: float, end: float) -> pd.DataFrame:
    return _read(url, q.decisions_frame, sidecar_ids, start, end)


@st.cache_data(ttl=TTL, show_spinner=False)
def audit(url: str, start: float, end: float) -> pd.DataFrame:
    return _read(url, q.audit_frame, start, end)


@st.cache_data(ttl=TTL, show_spinner=False)
def alerts(url: str, since: float, until: float | None = None) -> pd.DataFrame:
    return _read(url, q.alerts_frame, since=since, until=until)


@st.cache_data(ttl=TTL, show_spinner=False)
def silences(url: str, now: float) -> pd.DataFrame:
    return _read(url, q.silences_frame, now)


@st.cache_data(ttl=TTL, show_spinner=False)
def events(url: str, ref: q.EngineRef, start: float, end: float) -> pd.DataFrame:
    return _read(url, q.events_frame, ref, start, end)


@st.cache_data(ttl=TTL, show_spinner=False)
def audit_for(url: str, target_ids: tuple[int, ...], start: float, end: float) -> pd.DataFrame:
    return _read(url, q.audit_frame, start, end, target_ids=target_ids)


@st.cache_data(ttl=30, show_spinner=False)
def alert_settings(config_path: str | None) -> Any:
    """The alert settings in force: the fleet TOML's ``[alerts]`` (read through `collectors.config`, the
    one grammar), else `core.alerts.AlertSettings` defaults. An unreadable file logs and gives defaults."""
    from collectors.config import ConfigError, load_config
    from core.alerts import AlertSettings

    if config_path:
        try:
            return load_config(config_path).alerts
        except (ConfigError, OSError, ValueError) as exc:
            logger.warning("alert settings from %s unreadable, using defaults: %s", config_path, exc)
    return AlertSettings()


def clear_caches() -> None:
    """After a write (ack, silence, action), so the next run shows it."""
    st.cache_data.clear()
