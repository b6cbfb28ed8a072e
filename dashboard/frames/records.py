"""The sidecars' documents (state, sessions, subtrees, compaction decisions), the audit log, alerts
and silences as frames, and the events marked on an engine's charts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from sqlalchemy import Connection

from dashboard.frames.engines import EngineRef
from db import queries as dbq


def sidecar_states(conn: Connection) -> dict[int, dict[str, Any]]:
    return {
        r["target_id"]: {
            "ts": r["ts"],
            "state": r["state"] or {},
            "regime": r["regime"],
            "budgeter_mode": r["budgeter_mode"],
            "compaction_deferred_until": r["compaction_deferred_until"],
            "warnings": list(r["warnings"] or []),
        }
        for r in dbq.sidecar_state(conn)
    }


SESSION_COLUMNS = [
    "target_id",
    "session_id",
    "state",
    "context_tokens",
    "turns",
    "last_cached_fraction",
    "parked_since",
    "manual",
    "pinned",
    "first_seen_ts",
    "last_seen_ts",
    "present",
    "data",
]


def sessions_frame(
    conn: Connection, sidecar_target_ids: Sequence[int], *, include_gone: bool = False
) -> pd.DataFrame:
    if not sidecar_target_ids:
        return pd.DataFrame(columns=SESSION_COLUMNS)
    records = []
    for s in dbq.sessions(
        conn, target_id=list(sidecar_target_ids), present_only=not include_gone, limit=1_000_000
    ):
        data = s["data"] or {}
        parked_since = data.get("parked_since")
        records.append(
            {
                **{k: s[k] for k in SESSION_COLUMNS if k in s},
                "data": data,
                "parked_since": float(parked_since) if isinstance(parked_since, int | float) else None,
            }
        )
    frame = pd.DataFrame.from_records(records, columns=SESSION_COLUMNS)
    return frame.sort_values(["target_id", "session_id"], ignore_index=True) if len(frame) else frame


def subtrees_frame(conn: Connection, sidecar_target_ids: Sequence[int]) -> pd.DataFrame:
    columns = [
        "target_id",
        "subtree_id",
        "tokens",
        "warm",
        "pinned",
        "recent_hits",
        "last_hit_ts",
        "last_seen_ts",
    ]
    if not sidecar_target_ids:
        return pd.DataFrame(columns=columns)
    found = dbq.subtrees(conn, target_id=list(sidecar_target_ids), limit=1_000_000)
    return pd.DataFrame.from_records([{k: r[k] for k in columns} for r in found], columns=columns)


def decisions_frame(
    conn: Connection, sidecar_target_ids: Sequence[int], start: float, end: float, limit: int = 500
) -> pd.DataFrame:
    columns = ["ts", "target_id", "subtree_id", "decision", "granted", "reason", "divergence"]
    if not sidecar_target_ids:
        return pd.DataFrame(columns=columns)
    found = dbq.compaction_decisions(
        conn, target_id=list(sidecar_target_ids), since_ts=start, until_ts=end, limit=limit
    )
    return pd.DataFrame.from_records([{k: r[k] for k in columns} for r in found], columns=columns)


# ------------------------------------------------------------------ audit and alerts
def audit_frame(
    conn: Connection, start: float, end: float, *, target_ids: Sequence[int] | None = None, limit: int = 5000
) -> pd.DataFrame:
    columns = [
        "ts",
        "source",
        "target_id",
        "target",
        "actor",
        "action",
        "params",
        "outcome",
        "before",
        "after",
    ]
    records = []
    for entry in dbq.audit(conn, target_id=target_ids, since_ts=start, until_ts=end, limit=limit):
        data = entry["data"] or {}
        records.append(
            {
                "ts": entry["ts"],
                "source": entry["source"],
                "target_id": entry["target_id"],
                "target": entry["target_name"] or entry["target_url"] or "",
                "actor": entry["actor"],
                "action": entry["action"],
                "params": entry["params"] or {},
                "outcome": entry["outcome"],
                "before": data.get("before"),
                "after": data.get("after"),
            }
        )
    return pd.DataFrame.from_records(records, columns=columns)


ALERT_COLUMNS = [
    "id",
    "rule",
    "target_id",
    "target",
    "engine_label",
    "severity",
    "state",
    "started_ts",
    "resolved_ts",
    "summary",
    "values",
    "acknowledged_by",
    "acknowledged_ts",
    "silenced",
]


def alerts_frame(
    conn: Connection, *, since: float, until: float | None = None, target_ids: Sequence[int] | None = None
) -> pd.DataFrame:
    """Firing alerts (whenever they started) and alerts that started or resolved after `since`, newest first."""
    records = []
    for a in dbq.alerts(conn, target_id=target_ids, since_ts=since, until_ts=until, limit=100_000):
        records.append(
            {
                **{k: a[k] for k in ALERT_COLUMNS if k in a},
                "target": a["target_name"] or a["target_url"] or "",
                "values": a["values"] or {},
                "silenced": bool(a["silenced"]),
            }
        )
    frame = pd.DataFrame.from_records(records, columns=ALERT_COLUMNS)
    return frame.sort_values("started_ts", ascending=False, ignore_index=True) if len(frame) else frame


def firing_at(alerts: pd.DataFrame, at: float) -> pd.DataFrame:
    """The rows of an `alerts_frame` that were firing at `at` (started by then, not resolved by then), with
    ``state`` set to "firing": an episode firing then may be resolved now. Read the frame with ``until=at``
    and ``since`` early enough to hold the episodes open then."""
    if alerts.empty:
        return alerts
    then = (alerts["started_ts"] <= at) & (alerts["resolved_ts"].isna() | (alerts["resolved_ts"] > at))
    return alerts[then].assign(state="firing")


def silences_frame(conn: Connection, now: float) -> pd.DataFrame:
    """Silences not yet ended at `now`, the soonest to end first."""
    columns = ["id", "rule", "target_id", "target", "starts_ts", "ends_ts", "created_by", "comment"]
    found = dbq.silences(conn, ending_after=now)
    frame = pd.DataFrame.from_records(
        [{**{k: r[k] for k in columns if k in r}, "target": r["target_name"]} for r in found], columns=columns
    )
    return frame.sort_values("ends_ts", ignore_index=True) if len(frame) else frame


def events_frame(conn: Connection, ref: EngineRef, start: float, end: float) -> pd.DataFrame:
    """Markers for an engine's charts: operator actions, compaction decisions, alerts opening and closing."""
    ids = list(ref.target_ids)
    records: list[dict[str, Any]] = []
    if ids:
        audit = audit_frame(conn, start, end, target_ids=ids, limit=500)
        for r in audit.itertuples():
            if r.action in SIGN_IN_ACTIONS:
                continue
            what = r.params.get("mode") if isinstance(r.params, dict) and r.params.get("mode") else r.action
            records.append(
                {
                    "ts": r.ts,
                    "kind": "action",
                    "label": f"{r.actor or '?'}: {what}",
                    "text": f"{r.actor or '?'}: {r.action} {_compact(r.params)} -> {r.outcome}",
                }
            )
        if ref.sidecar_target_id is not None:
            dec = decisions_frame(conn, [ref.sidecar_target_id], start, end, limit=500)
            for r in dec.itertuples():
                records.append(
                    {
                        "ts": r.ts,
                        "kind": "compaction",
                        "label": "",
                        "text": f"compaction {r.decision or '?'} {r.subtree_id or ''}: {r.reason or ''}",
                    }
                )
        for a in dbq.alerts(conn, target_id=ids, since_ts=start, until_ts=end, limit=1000):
            if start <= a["started_ts"] <= end:
                records.append(
                    {
                        "ts": a["started_ts"],
                        "kind": "alert",
                        "label": f"{a['rule']} fired",
                        "text": f"alert {a['rule']} ({a['severity']}) opened: {a['summary']}",
                    }
                )
            if a["resolved_ts"] is not None and start <= a["resolved_ts"] <= end:
                records.append(
                    {
                        "ts": a["resolved_ts"],
                        "kind": "alert",
                        "label": f"{a['rule']} resolved",
                        "text": f"alert {a['rule']} closed",
                    }
                )
    frame = pd.DataFrame.from_records(records, columns=["ts", "kind", "label", "text"])
    return frame.sort_values("ts").reset_index(drop=True)


SIGN_IN_ACTIONS = frozenset({"sign-in", "sign-out"})  # who signed in is no event on an engine's charts


def _compact(params: Any) -> str:
    if not params:
        return ""
    if isinstance(params, dict):
        return " ".join(f"{k}={v}" for k, v in params.items())
    return str(params)
