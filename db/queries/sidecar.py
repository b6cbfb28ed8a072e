"""What the sidecars reported: their latest /state, sessions, subtrees, compaction decisions, and the audit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from db.models import AuditEntry, CompactionDecision, Session, SidecarState, Subtree, Target
from db.queries._common import Conn, id_list, run

TargetIds = Sequence[int] | int | None


def sidecar_state(conn: Conn, target_id: TargetIds = None) -> list[dict[str, Any]]:
    """Latest /state per sidecar: every column of ``sidecar_state`` (``state`` is the /state JSON,
    ``regime``, ``budgeter_mode``, ``compaction_deferred_until``, ``warnings``) plus url, name, engine_url."""
    stmt = (
        select(*SidecarState.__table__.columns, Target.url, Target.name, Target.engine_url)
        .join(Target, Target.id == SidecarState.target_id)
        .order_by(Target.url)
    )
    ids = id_list(target_id)
    if ids is not None:
        stmt = stmt.where(SidecarState.target_id.in_(ids))
    return run(conn, stmt)


def sessions(
    conn: Conn,
    *,
    target_id: TargetIds = None,
    present_only: bool = True,
    state: str | None = None,
    seen_between: tuple[float, float] | None = None,
    limit: int = 5000,
) -> list[dict[str, Any]]:
    """Sessions the sidecars know (every column of ``sessions`` plus target_url, target_name),
    largest context first; ``seen_between`` (start, end): only those seen at some time in it."""
    stmt = select(
        *Session.__table__.columns, Target.url.label("target_url"), Target.name.label("target_name")
    ).join(Target, Target.id == Session.target_id)
    ids = id_list(target_id)
    if ids is not None:
        stmt = stmt.where(Session.target_id.in_(ids))
    if present_only:
        stmt = stmt.where(Session.present.is_(True))
    if state is not None:
        stmt = stmt.where(Session.state == state)
    if seen_between is not None:
        stmt = stmt.where(Session.last_seen_ts >= seen_between[0], Session.first_seen_ts <= seen_between[1])
    stmt = stmt.order_by(Session.context_tokens.desc().nulls_last(), Session.session_id).limit(limit)
    return run(conn, stmt)


def subtrees(
    conn: Conn, *, target_id: TargetIds = None, present_only: bool = True, limit: int = 5000
) -> list[dict[str, Any]]:
    """Shared-prefix subtrees the sidecars track, most recently hit first."""
    stmt = select(*Subtree.__table__.columns, Target.url.label("target_url")).join(
        Target, Target.id == Subtree.target_id
    )
    ids = id_list(target_id)
    if ids is not None:
        stmt = stmt.where(Subtree.target_id.in_(ids))
    if present_only:
        stmt = stmt.where(Subtree.present.is_(True))
    stmt = stmt.order_by(Subtree.recent_hits.desc().nulls_last(), Subtree.subtree_id).limit(limit)
    return run(conn, stmt)


def compaction_decisions(
    conn: Conn,
    *,
    target_id: TargetIds = None,
    since_ts: float | None = None,
    until_ts: float | None = None,
    limit: int = 500,
) -> list[dict[str, Any]]:
    """Compaction decisions in [since_ts, until_ts], newest first."""
    stmt = select(*CompactionDecision.__table__.columns, Target.url.label("target_url")).join(
        Target, Target.id == CompactionDecision.target_id
    )
    ids = id_list(target_id)
    if ids is not None:
        stmt = stmt.where(CompactionDecision.target_id.in_(ids))
    if since_ts is not None:
        stmt = stmt.where(CompactionDecision.ts >= since_ts)
    if until_ts is not None:
        stmt = stmt.where(CompactionDecision.ts <= until_ts)
    return run(conn, stmt.order_by(CompactionDecision.ts.desc(), CompactionDecision.id.desc()).limit(limit))


def audit(
    conn: Conn,
    *,
    target_id: TargetIds = None,
    source: str | None = None,
    since_ts: float | None = None,
    until_ts: float | None = None,
    limit: int = 500,
) -> list[dict[str, Any]]:
    """Audit trail (sidecar entries and dashboard actions) in [since_ts, until_ts], newest first;
    with target_url and target_name of the target (None for dashboard-wide rows)."""
    stmt = select(
        *AuditEntry.__table__.columns, Target.url.label("target_url"), Target.name.label("target_name")
    ).outerjoin(Target, Target.id == AuditEntry.target_id)
    ids = id_list(target_id)
    if ids is not None:
        stmt = stmt.where(AuditEntry.target_id.in_(ids))
    if source is not None:
        stmt = stmt.where(AuditEntry.source == source)
    if since_ts is not None:
        stmt = stmt.where(AuditEntry.ts >= since_ts)
    if until_ts is not None:
        stmt = stmt.where(AuditEntry.ts <= until_ts)
    return run(conn, stmt.order_by(AuditEntry.ts.desc(), AuditEntry.id.desc()).limit(limit))
