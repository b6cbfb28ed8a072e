"""Budgeter preview: rebuild the sidecar's budgeter from the database rows and ask `core.budgeter`.

A thin adapter only: the decision (who would be parked, who admitted) is
`core.budgeter.Budgeter.preview`, the same code the sidecar runs. What the
copy cannot know: requests in flight and held turns (not in the rows) and the
recent latencies `latency-park` judges by, so a latency-park preview parks
nobody.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from core.budgeter import SESSION_STATES, Budgeter, BudgeterConfig, Preview

__all__ = ["Preview", "budgeter_from_rows", "current_config", "preview"]

CONFIG_FIELDS = ("mode", "low", "high", "session_cap", "latency_limit_s", "default_output_budget")


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def current_config(budgeter_state: dict[str, Any]) -> BudgeterConfig:
    """The sidecar's budgeter config from its /state `budgeter` object (defaults for missing fields)."""
    known = {k: budgeter_state[k] for k in CONFIG_FIELDS if budgeter_state.get(k) is not None}
    return BudgeterConfig(**known)


def budgeter_from_rows(budgeter_state: dict[str, Any], sessions: pd.DataFrame) -> Budgeter:
    pool = budgeter_state.get("pool_tokens")
    rows = []
    for r in sessions.itertuples():
        if r.state not in SESSION_STATES:
            continue
        doc = r.data if isinstance(r.data, dict) else {}
        first_seen = _num(r.first_seen_ts) or 0.0
        rows.append(
            {
                "id": str(r.session_id),
                "state": r.state,
                "arrived_at": _num(doc.get("arrived_at")) or first_seen,
                "admitted_at": _num(doc.get("admitted_at")),
                "context_tokens": int(r.context_tokens or 0),
                "output_budget": int(_num(doc.get("output_budget")) or 0),
                "turns": int(r.turns or 0),
                "manual": bool(r.manual),
                "pinned": bool(r.pinned),
                "parked_since": _num(doc.get("parked_since")),
                "last_activity": _num(doc.get("last_activity")) or _num(r.last_seen_ts) or first_seen,
            }
        )
    return Budgeter.from_dict(
        {
            "config": current_config(budgeter_state).to_dict(),
            "pool_tokens": int(pool) if _num(pool) else None,
            "sessions": rows,
        }
    )


def preview(
    budgeter_state: dict[str, Any], sessions: pd.DataFrame, config: BudgeterConfig, now: float
) -> Preview:
    return budgeter_from_rows(budgeter_state, sessions).preview(config, now)
