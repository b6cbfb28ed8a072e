"""What the pages write: their audit rows, alert acknowledgements, silences added and expired.

Each is one short transaction through `db.queries`; the collectors stay the only writer of
everything else.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Engine

from db import queries as dbq


def write_audit(
    engine: Engine,
    *,
    actor: str | None,
    action: str,
    outcome: str,
    params: dict[str, Any] | None = None,
    target_url: str | None = None,
    now: float | None = None,
) -> None:
    """One dashboard audit row (source='dashboard'), in its own short transaction."""
    dbq.record_dashboard_action(
        engine,
        actor=actor,
        action=action,
        target_url=target_url,
        params=params or {},
        outcome=outcome[:2000],
        ts=now,
    )


def acknowledge_alert(engine: Engine, alert_id: int, actor: str, now: float | None = None) -> bool:
    """Mark an alert acknowledged; False when it is unknown or already acknowledged."""
    return dbq.acknowledge_alert(engine, alert_id, by=actor, ts=now)


def add_silence(
    engine: Engine,
    *,
    rule: str | None,
    target_id: int | None,
    minutes: float,
    actor: str,
    comment: str | None = None,
    now: float | None = None,
) -> None:
    if math.isnan(minutes) or not (0 < minutes <= 7 * 24 * 60):
        raise ValueError(f"silence duration must be between 1 minute and 7 days, got {minutes!r} minutes")
    dbq.add_silence(
        engine, rule=rule, target_id=target_id, duration_s=minutes * 60, by=actor, comment=comment, now=now
    )


def expire_silence(engine: Engine, silence_id: int, now: float | None = None) -> bool:
    """End a silence now; False when it is unknown or already over."""
    return dbq.expire_silence(engine, silence_id, now=now)
