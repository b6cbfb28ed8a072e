"""Helpers every query module shares: running a statement on a Connection or an Engine, engine labels."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine

Conn = Connection | Engine


def run(conn: Conn, stmt: Any, params: Any = None) -> list[dict[str, Any]]:
    """Rows as dicts keyed by column name."""
    if isinstance(conn, Engine):
        with conn.connect() as c:
            return run(c, stmt, params)
    result = conn.execute(stmt, params) if params is not None else conn.execute(stmt)
    return [dict(row._mapping) for row in result]


def rows(conn: Conn, stmt: Any) -> list[Any]:
    """Plain tuples (the hot path of chart queries: no per-row dict)."""
    if isinstance(conn, Engine):
        with conn.connect() as c:
            return rows(c, stmt)
    return list(conn.execute(stmt).all())


def write(conn: Conn, stmt: Any) -> Any:
    """Execute a write in its own transaction when given an Engine."""
    if isinstance(conn, Engine):
        with conn.begin() as c:
            return c.execute(stmt)
    return conn.execute(stmt)


def engine_out(label: str | None) -> str | None:
    """The stored label ``""`` (no engine label) as None for callers."""
    return label or None


def engine_in(label: str | None) -> str:
    return label or ""


def id_list(ids: Any) -> list[int] | None:
    """None (no filter) or a list of target ids from an int, an iterable or None."""
    if ids is None:
        return None
    if isinstance(ids, int):
        return [ids]
    return list(ids)
