"""Sidecar JSON documents to rows and canonical signals. Pure and defensive.

A missing or mistyped field becomes None (never a crash); a document of the wrong shape
altogether (``/state`` not an object, ``/sessions`` not a list) raises `SidecarPayloadError`,
which the collector records as a failed scrape with that reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from core import signals as sig


class SidecarPayloadError(ValueError):
    """A sidecar answered JSON of the wrong shape; the message says which document and why."""


def _get(doc: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(part)
    return doc


def num(value: Any) -> float | None:
    """A finite float, or None (bools, strings, NaN and infinities are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def integer(value: Any) -> int | None:
    f = num(value)
    return None if f is None else int(f)


def boolean(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def text(value: Any, limit: int = 1000) -> str | None:
    if value is None:
        return None
    return str(value)[:limit]


def contract_problem(model: type[BaseModel], doc: Any) -> str | None:
    """Why `doc` does not match its typed wire contract (`sidecar.wire`), in one line; None if it does.
    The reader still takes such a document field by field: a drifted field costs that field only."""
    try:
        model.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "document"
        return f"{where}: {first.get('msg', 'invalid')} ({exc.error_count()} problem(s))"
    return None


def require_object(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise SidecarPayloadError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    return doc


def require_list(doc: Any, what: str) -> list[Mapping[str, Any]]:
    if not isinstance(doc, list):
        raise SidecarPayloadError(f"{what}: expected a JSON list, got {type(doc).__name__}")
    return [item for item in doc if isinstance(item, Mapping)]


def state_signals(state: Mapping[str, Any]) -> dict[str, float]:
    """Canonical signals in one /state document (rates such as turns_per_s are the caller's: they
    need two documents). Absent fields give no signal."""
    out: dict[str, float | None] = {
        sig.TOKEN_WEIGHTED: num(_get(state, "reuse", "token_weighted")),
        sig.REQUEST_WEIGHTED: num(_get(state, "reuse", "request_weighted")),
        sig.DIVERGENCE: num(_get(state, "reuse", "divergence")),
        sig.KNOWN_TURNS: num(_get(state, "reuse", "known_turns")),
        sig.LOW_HALF_CACHED_FRACTION: num(_get(state, "reuse", "low_cached_fraction"))
        if _get(state, "reuse", "low_half_cached_fraction") is None
        else num(_get(state, "reuse", "low_half_cached_fraction")),
        sig.POOL_TOKENS: num(_get(state, "budgeter", "pool_tokens")),
        sig.DEMAND_TOKENS: num(_get(state, "budgeter", "demand_tokens")),
        sig.BAND_LOW: num(_get(state, "budgeter", "low")),
        sig.BAND_HIGH: num(_get(state, "budgeter", "high")),
        sig.ADMITTED: num(_get(state, "backlog", "admitted")),
        sig.PARKED: num(_get(state, "backlog", "parked")),
        sig.WAITING: num(_get(state, "backlog", "waiting")),
        sig.OLDEST_PARKED_S: num(_get(state, "backlog", "oldest_parked_s")),
        sig.TIME_TO_ADMIT_P50: num(_get(state, "backlog", "time_to_admit_s", "p50")),
        sig.TIME_TO_ADMIT_P95: num(_get(state, "backlog", "time_to_admit_s", "p95")),
        sig.PARK_TIME_P50: num(_get(state, "backlog", "park_time_s", "p50")),
        sig.PARK_TIME_P95: num(_get(state, "backlog", "park_time_s", "p95")),
    }
    regime = _get(state, "reuse", "regime")
    if isinstance(regime, str):
        out[sig.THIN_REUSE] = 1.0 if regime == "thin-reuse" else 0.0
    fraction = num(_get(state, "budgeter", "demand_fraction"))
    pool, demand = out[sig.POOL_TOKENS], out[sig.DEMAND_TOKENS]
    if fraction is None and pool and demand is not None:
        fraction = demand / pool
    out[sig.DEMAND_FRACTION] = fraction
    projected = num(_get(state, "budgeter", "projected_demand_fraction"))
    projected_tokens = num(_get(state, "budgeter", "projected_demand_tokens"))
    if projected is None and pool and projected_tokens is not None:
        projected = projected_tokens / pool
    out[sig.PROJECTED_DEMAND_FRACTION] = projected
    total = num(_get(state, "backlog", "total"))
    if total is None and all(out[k] is not None for k in (sig.ADMITTED, sig.PARKED, sig.WAITING)):
        total = sum(out[k] or 0.0 for k in (sig.ADMITTED, sig.PARKED, sig.WAITING))
    out[sig.SESSIONS_IN_SYSTEM] = total
    oldest = num(_get(state, "backlog", "oldest_waiting_s"))
    if (
        oldest is None
        and isinstance(state.get("backlog"), Mapping)
        and "oldest_waiting_s" in state["backlog"]
    ):
        oldest = 0.0  # null: nobody waits
    out[sig.OLDEST_WAITING_S] = oldest
    return {k: v for k, v in out.items() if v is not None}


def turns_total(state: Mapping[str, Any]) -> float | None:
    """The sidecar's cumulative completed-turn counter (for turns_per_s)."""
    for path in (("traffic", "turns_total"), ("turns_total",), ("counters", "turns")):
        value = num(_get(state, *path))
        if value is not None:
            return value
    return None


def started_at(state: Mapping[str, Any]) -> float | None:
    return num(_get(state, "started_at"))


def state_meta(state: Mapping[str, Any]) -> dict[str, Any]:
    """Typed columns of the sidecar_state row."""
    warnings = state.get("warnings")
    return {
        "regime": text(_get(state, "reuse", "regime"), 32),
        "budgeter_mode": text(_get(state, "budgeter", "mode"), 32),
        "compaction_deferred_until": num(_get(state, "compaction", "deferred_until")),
        "warnings": [str(w) for w in warnings] if isinstance(warnings, list) else None,
    }


def session_row(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    sid = doc.get("id", doc.get("session_id"))
    if sid is None:
        return None
    state = text(doc.get("state"), 32)
    return {
        "session_id": str(sid)[:256],
        "state": state,
        "context_tokens": integer(doc.get("context_tokens")),
        "turns": integer(doc.get("turns")),
        "manual": boolean(doc.get("manual")),
        "pinned": boolean(doc.get("pinned")),
        "last_cached_fraction": num(doc.get("last_cached_fraction")),
        "present": state != "ended",
        "data": dict(doc),
    }


def subtree_row(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    sid = doc.get("id", doc.get("subtree_id"))
    if sid is None:
        return None
    pinned = doc.get("pinned", doc.get("pinned_under_pressure"))
    return {
        "subtree_id": str(sid)[:256],
        "tokens": integer(doc.get("tokens", doc.get("prefix_tokens"))),
        "warm": boolean(doc.get("warm")),
        "pinned": boolean(pinned),
        "recent_hits": num(doc.get("recent_hits")),
        "last_hit_ts": num(doc.get("last_seen", doc.get("last_hit_ts"))),
        "present": True,
        "data": dict(doc),
    }


def decision_row(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    remote_id = integer(doc.get("id"))
    if remote_id is None:
        return None
    decision = text(doc.get("decision"), 32)
    granted = None if decision is None else decision.lower() in ("granted", "grant", "allow", "allowed")
    return {
        "remote_id": remote_id,
        "ts": num(doc.get("ts")),
        "subtree_id": text(doc.get("subtree_id", doc.get("subtree")), 256),
        "decision": decision,
        "granted": granted,
        "reason": text(doc.get("reason")),
        "divergence": num(doc.get("divergence")),
        "data": dict(doc),
    }


def audit_row(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    remote_id = integer(doc.get("id"))
    if remote_id is None:
        return None
    params = doc.get("params")
    after = doc.get("after")
    return {
        "remote_id": remote_id,
        "ts": num(doc.get("ts")),
        "actor": text(doc.get("actor"), 200),
        "action": text(doc.get("action"), 200),
        "params": params if isinstance(params, dict) else ({"value": params} if params is not None else None),
        "outcome": text(doc.get("outcome")) or ("ok" if after is not None else None),
        "data": dict(doc),
    }
