"""Targets (scraped endpoints with their up/down and last scrape times) and collectors' heartbeats."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from db.models import CollectorHeartbeat, Target
from db.queries._common import Conn, run


def targets(conn: Conn, *, role: str | None = None, configured_only: bool = False) -> list[dict[str, Any]]:
    """All targets (every column of ``targets``), engines first, by name/URL."""
    stmt = select(*Target.__table__.columns).order_by(Target.role, Target.name, Target.url)
    if role:
        stmt = stmt.where(Target.role == role)
    if configured_only:
        stmt = stmt.where(Target.configured.is_(True))
    return run(conn, stmt)


def target_by_url(conn: Conn, url: str) -> dict[str, Any] | None:
    found = run(conn, select(*Target.__table__.columns).where(Target.url == url.rstrip("/")))
    return found[0] if found else None


def heartbeat(conn: Conn) -> list[dict[str, Any]]:
    """Collector heartbeats (one row per collector process name)."""
    return run(conn, select(*CollectorHeartbeat.__table__.columns).order_by(CollectorHeartbeat.name))
