"""Alert episodes and silences, read; and the dashboard's own writes (audit rows, acknowledgements,
silences), the only writes outside the collectors process."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, insert, or_, select, update

from db.models import Alert, AuditEntry, Silence, Target
from db.queries._common import Conn, engine_out, id_list, run, write
from db.queries.targets import target_by_url


def alerts(
    conn: Conn,
    *,
    state: str | None = None,
    target_id: Sequence[int] | int | None = None,
    since_ts: float | None = None,
    until_ts: float | None = None,
    limit: int = 500,
) -> list[dict[str, Any]]:
    """Alert episodes, firing first then newest first, with target_url and target_name; ``engine`` is the
    engine label or None. `since_ts`: those firing, or started or resolved since then; `until_ts`: started
    by then."""
    stmt = select(
        *Alert.__table__.columns, Target.url.label("target_url"), Target.name.label("target_name")
    ).outerjoin(Target, Target.id == Alert.target_id)
    if state is not None:
        stmt = stmt.where(Alert.state == state)
    ids = id_list(target_id)
    if ids is not None:
        stmt = stmt.where(Alert.target_id.in_(ids))
    if since_ts is not None:
        stmt = stmt.where(
            or_(Alert.state == "firing", Alert.started_ts >= since_ts, Alert.resolved_ts >= since_ts)
        )
    if until_ts is not None:
        stmt = stmt.where(Alert.started_ts <= until_ts)
    stmt = stmt.order_by(case((Alert.state == "firing", 0), else_=1), Alert.started_ts.desc()).limit(limit)
    found = run(conn, stmt)
    for row in found:
        row["engine"] = engine_out(row["engine_label"])
    return found


def open_alerts(conn: Conn, target_id: int | None = None) -> list[dict[str, Any]]:
    return alerts(conn, state="firing", target_id=target_id)


def silences(
    conn: Conn, *, active_at: float | None = None, ending_after: float | None = None
) -> list[dict[str, Any]]:
    """Silences, newest first, with target_url and target_name: those active at `active_at`, or not ended
    by `ending_after`, when given."""
    stmt = select(
        *Silence.__table__.columns, Target.url.label("target_url"), Target.name.label("target_name")
    ).outerjoin(Target, Target.id == Silence.target_id)
    if active_at is not None:
        stmt = stmt.where(Silence.starts_ts <= active_at, Silence.ends_ts > active_at)
    if ending_after is not None:
        stmt = stmt.where(Silence.ends_ts > ending_after)
    return run(conn, stmt.order_by(Silence.created_ts.desc(), Silence.id.desc()))


def record_dashboard_action(
    conn: Conn,
    *,
    actor: str | None,
    action: str,
    target_url: str | None = None,
    params: dict[str, Any] | None = None,
    outcome: str | None = None,
    ts: float | None = None,
) -> None:
    """Audit one control action sent from the dashboard (source='dashboard')."""
    target_id = None
    if target_url is not None:
        found = target_by_url(conn, target_url)
        target_id = found["id"] if found else None
    write(
        conn,
        insert(AuditEntry).values(
            source="dashboard",
            target_id=target_id,
            remote_id=None,
            ts=ts if ts is not None else time.time(),
            actor=actor,
            action=action,
            params=params or {},
            outcome=outcome,
            data={"target_url": target_url} if target_url else {},
        ),
    )


def acknowledge_alert(conn: Conn, alert_id: int, *, by: str, ts: float | None = None) -> bool:
    """Mark an alert acknowledged; False when it does not exist or is already acknowledged."""
    result = write(
        conn,
        update(Alert)
        .where(Alert.id == alert_id, Alert.acknowledged_ts.is_(None))
        .values(acknowledged_by=by, acknowledged_ts=ts if ts is not None else time.time()),
    )
    return bool(result.rowcount)


def add_silence(
    conn: Conn,
    *,
    rule: str | None,
    target_id: int | None,
    duration_s: float,
    by: str | None,
    comment: str | None = None,
    now: float | None = None,
) -> None:
    """Silence notifications for `rule` (None = all rules) on `target_id` (None = all targets)."""
    if duration_s <= 0:
        raise ValueError(f"silence duration must be positive, got {duration_s}")
    start = now if now is not None else time.time()
    write(
        conn,
        insert(Silence).values(
            rule=rule,
            target_id=target_id,
            starts_ts=start,
            ends_ts=start + duration_s,
            created_by=by,
            created_ts=start,
            comment=comment,
        ),
    )


def expire_silence(conn: Conn, silence_id: int, *, now: float | None = None) -> bool:
    """End a silence now; False when it does not exist or has already ended."""
    at = now if now is not None else time.time()
    result = write(
        conn, update(Silence).where(Silence.id == silence_id, Silence.ends_ts > at).values(ends_ts=at)
    )
    return bool(result.rowcount)
