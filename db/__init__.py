"""Database layer: models, engine factory, migrations and the queries the pages need.

`make_engine(url)` is the one way to open the database:

- SQLite (default ``sqlite:///data/prefixops.db``): WAL journal, ``synchronous=NORMAL``,
  a busy timeout and foreign keys, all set in a ``connect`` event so every pooled
  connection gets them. ``read_only=True`` opens the file with ``mode=ro`` (the
  dashboard's readers); it needs the file to exist (the collectors create it).
- PostgreSQL: ``postgresql://...`` (the psycopg 3 driver is chosen for you);
  ``read_only=True`` sets the session read-only.

`database_url(cli_value)` resolves ``--database-url`` > ``$PREFIXOPS_DATABASE_URL`` > ``$DATABASE_URL``
> the default.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from db.models import Base

DEFAULT_DATABASE_URL = "sqlite:///data/prefixops.db"
SQLITE_BUSY_TIMEOUT_MS = 10_000

__all__ = ["Base", "DEFAULT_DATABASE_URL", "database_url", "make_engine", "sqlite_path"]


def database_url(cli_value: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The database URL to use: the command-line value, else $PREFIXOPS_DATABASE_URL, else
    $DATABASE_URL (the unprefixed name of the first releases), else the default."""
    from core.environment import setting

    return cli_value or setting(os.environ if env is None else env, "DATABASE_URL") or DEFAULT_DATABASE_URL


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL (None for in-memory or non-SQLite URLs)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _normalise(url: str) -> str:
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def make_engine(
    url: str | None = None,
    *,
    read_only: bool = False,
    echo: bool = False,
    lock_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
    **kwargs: Any,
) -> Engine:
    """Open the database at `url` (see module docstring); creates data/ for a SQLite file when writing.

    `lock_timeout_ms`: how long a statement waits for a lock before it fails (SQLite's busy
    timeout; PostgreSQL's ``lock_timeout``)."""
    url = _normalise(database_url(url))
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _make_sqlite_engine(
            url, read_only=read_only, echo=echo, lock_timeout_ms=lock_timeout_ms, **kwargs
        )
    if lock_timeout_ms != SQLITE_BUSY_TIMEOUT_MS:
        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args["options"] = (
            f"{connect_args.get('options', '')} -c lock_timeout={int(lock_timeout_ms)}".strip()
        )
        kwargs["connect_args"] = connect_args
    engine = create_engine(url, echo=echo, pool_pre_ping=True, **kwargs)
    if read_only:
        engine = engine.execution_options(postgresql_readonly=True)
    return engine


def _make_sqlite_engine(
    url: str, *, read_only: bool, echo: bool, lock_timeout_ms: int, **kwargs: Any
) -> Engine:
    path = sqlite_path(url)
    if path is None:
        # In-memory: one shared connection, or every connection would see its own empty database.
        from sqlalchemy.pool import StaticPool

        engine = create_engine(
            url, echo=echo, poolclass=StaticPool, connect_args={"check_same_thread": False}, **kwargs
        )
    elif read_only:
        resolved = path.resolve()

        def connect_read_only() -> sqlite3.Connection:
            return sqlite3.connect(
                f"file:{resolved}?mode=ro", uri=True, check_same_thread=False, timeout=lock_timeout_ms / 1000
            )

        kwargs.setdefault("poolclass", NullPool)
        engine = create_engine("sqlite://", creator=connect_read_only, echo=echo, **kwargs)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": lock_timeout_ms / 1000},
            **kwargs,
        )

    @event.listens_for(engine, "connect")
    def _set_pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            if not read_only and path is not None:
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={int(lock_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    return engine
