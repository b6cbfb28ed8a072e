"""Typed wire contracts of the sidecar's read documents (issue 10 item 6).

These pydantic models are the response models of the sidecar's routes and the types the
collectors' reader validates against. This module imports only pydantic, typing and ``core``,
so a reader can import it without pulling in the sidecar's HTTP stack.

Documents:

- ``GET /state`` -> `StateDoc`
- ``GET /sessions`` -> ``list[SessionDoc]`` (the original form, every session), or, when any of
  ``updated_after``, ``limit`` or ``cursor`` is given, one `SessionsPage`:
  ``{"sessions": [...], "next": CURSOR or null}``. Sessions come in ascending
  ``(updated_at, id)`` order; ``updated_after=TS`` keeps those changed after ``TS`` (Unix s);
  pass ``next`` back as ``cursor`` for the following page; ``next`` is null on the last page.
  An incremental reader keeps the largest ``updated_at`` it has seen and asks with
  ``updated_after`` on its next cycle.
- ``GET /sessions/{id}`` -> `SessionDoc`
- ``GET /compaction/decisions`` -> ``list[DecisionDoc]``
- ``GET /audit`` -> ``list[AuditEntry]``
- ``GET /turns?after_id=N&limit=M`` -> `TurnsPage`: ``{"turns": [TurnDoc...], "next_after_id": N}``

Readers tolerate fields they do not know (``extra="ignore"``), so the sidecar may add fields
without breaking an older reader; the sidecar's tests check every field it sends is declared here.

Mode and state names are ``Literal`` types equal to ``core.budgeter.CONTROLS`` and
``SESSION_STATES``; importing this module fails if they drift apart.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from core.budgeter import CONTROLS, SESSION_STATES
from core.compaction import Urgency
from core.reuse import Regime

ControlMode = Literal["off", "admission-only", "latency-park", "session-cap-park", "budgeter-park"]
SessionState = Literal["admitted", "parked", "waiting"]
SessionDocState = Literal["admitted", "parked", "waiting", "ended"]
CompactionDecision = Literal["granted", "deferred"]
HealthStatus = Literal["ok", "degraded"]

if get_args(ControlMode) != CONTROLS:  # one source: core.budgeter names the modes
    raise ImportError(
        f"sidecar.wire.ControlMode {get_args(ControlMode)} != core.budgeter.CONTROLS {CONTROLS}"
    )
if get_args(SessionState) != SESSION_STATES:
    raise ImportError(
        f"sidecar.wire.SessionState {get_args(SessionState)} != core.budgeter.SESSION_STATES {SESSION_STATES}"
    )
if get_args(SessionDocState) != (*SESSION_STATES, "ended"):
    raise ImportError("sidecar.wire.SessionDocState must be core.budgeter.SESSION_STATES plus 'ended'")


class Wire(BaseModel):
    """Base of every wire model: readers ignore unknown fields."""

    model_config = ConfigDict(extra="ignore")


# ----------------------------------------------------------------------------- /state


class ReuseDoc(Wire):
    token_weighted: float | None = None
    request_weighted: float | None = None
    divergence: float | None = None
    turns: int = 0
    known_turns: int = 0
    unknown_turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    hit_turns: int = 0
    low_cached_fraction: float | None = None
    regime: Regime = "normal"
    window_s: float
    regime_judged: bool = False
    regime_enter: float
    regime_exit: float
    regime_min_turns: int


class LastTurnsDoc(Wire):
    token_weighted: float | None = None
    request_weighted: float | None = None
    divergence: float | None = None
    turns: int = 0
    known_turns: int = 0
    unknown_turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    hit_turns: int = 0
    low_cached_fraction: float | None = None
    n: int


class BudgeterDoc(Wire):
    mode: ControlMode
    low: float
    high: float
    pool_tokens: int | None = None
    pool_source: Literal["flag", "engine"] | None = None
    demand_tokens: int
    demand_fraction: float | None = None
    low_tokens: float | None = None
    high_tokens: float | None = None
    acting: bool
    session_cap: int
    latency_limit_s: float
    recent_latency_s: float | None = None
    default_output_budget: int
    park_set: int
    # what a prompt in flight is counted at: the engine's counts learned (``core.prompt_estimate``), or the
    # configured ``chars_per_token`` before enough turns
    chars_per_token: float | None = None
    chars_per_token_source: Literal["learned", "configured"] | None = None
    projected_demand_tokens: int | None = None  # admitted sessions' demand projection_horizon_s ahead
    projected_demand_fraction: float | None = None
    projection_horizon_s: float | None = None


class Percentiles(Wire):
    """Seconds over the recent window (``window_s``); null fields when no sample is in it."""

    p50: float | None = None
    p95: float | None = None
    max: float | None = None
    n: int = 0
    window_s: float | None = None


class BacklogDoc(Wire):
    admitted: int
    parked: int
    waiting: int
    total: int
    held_requests: int
    oldest_waiting_s: float | None = None
    """Seconds the longest-waiting new session has waited for admission; null when none waits."""
    oldest_parked_s: float | None = None
    """Seconds the longest-parked session has been parked; null when none is parked."""
    time_to_admit_s: Percentiles | None = None
    """How long held turns waited, from their arrival to being forwarded, over the recent window."""
    park_time_s: Percentiles | None = None
    """How long parks lasted (park to re-admission, unpark or the session's end), over the recent window."""


class TrafficDoc(Wire):
    in_flight: int
    turns_total: int
    unknown_turns_total: int
    engine_errors_total: int
    unsessioned_in_flight: int
    unsessioned_requests_total: int
    unsessioned_turns_in_window: int
    unsessioned_fraction: float | None = None


class CompactionStateDoc(Wire):
    deferred_until: float | None = None
    deferred_reason: str | None = None
    deferred_by: str | None = None
    granted_total: int
    deferred_total: int
    top_k_pinned: int
    warmth_floor: int
    warmth_window_s: float


class StateSession(Wire):
    """One session as embedded in /state (only with ``?include_sessions=true``)."""

    id: str
    state: SessionState
    turns: int
    context_tokens: int
    last_cached_fraction: float | None = None


class ModelDoc(Wire):
    """Totals since start for one request ``model`` (``(none)``: no model; ``(other)``: past the cap)."""

    turns_total: int
    errors_total: int
    prompt_tokens_total: int
    cached_tokens_total: int
    completion_tokens_total: int
    token_weighted: float | None = None
    mean_latency_s: float | None = None


class StateDoc(Wire):
    ts: float
    started_at: float
    engine: str
    engine_kind: str | None = None
    read_only: bool
    restored: bool
    reuse: ReuseDoc
    reuse_last_turns: LastTurnsDoc
    budgeter: BudgeterDoc
    backlog: BacklogDoc
    traffic: TrafficDoc
    compaction: CompactionStateDoc
    warnings: list[str]
    health: HealthStatus = "ok"
    degraded_reasons: list[str] = []
    models: dict[str, ModelDoc] = {}
    sessions: list[StateSession] | None = None


# -------------------------------------------------------------------------- /sessions


class SessionDoc(Wire):
    id: str
    state: SessionDocState
    context_tokens: int
    turns: int
    manual: bool
    pinned: bool
    held: int
    in_flight: int
    pending_prompt_tokens: int = 0
    """The prompt tokens of its turn in flight or held at the gate (0: none); the forecast starts it there."""
    demand_tokens: int
    output_budget: int
    last_cached_fraction: float | None = None
    last_prompt_tokens: int | None = None
    last_completion_tokens: int | None = None
    prompt_tokens: int
    cached_tokens: int
    failed_turns: int
    subtree: str | None = None
    parked_since: float | None = None
    admitted_at: float | None = None
    arrived_at: float
    last_activity: float
    last_latency_s: float | None = None
    updated_at: float | None = None
    """When this document last changed (Unix s): the key of incremental reads."""
    ended_at: float | None = None
    end_reason: str | None = None


class SessionsPage(Wire):
    sessions: list[SessionDoc]
    next: str | None = None
    """Cursor for the next page (pass as ``cursor``); null on the last page."""


# ------------------------------------------------------------ decisions, audit, health


class DecisionDoc(Wire):
    id: int
    ts: float
    request_id: str
    subtree_id: str
    decision: CompactionDecision
    reason: str
    urgency: Urgency
    regime: Regime
    request_reason: str
    warm: bool
    recent_hits: int
    recent_cached_tokens: int
    token_weighted: float | None = None
    divergence: float | None = None


class AuditEntry(Wire):
    id: int
    ts: float
    actor: str
    role: str
    action: str
    params: Any = None
    before: Any = None
    after: Any = None


class TurnDoc(Wire):
    """One turn of the trace (sidecar/turns.py): token counts, waits and outcome, never prompt content."""

    id: int
    ts: float
    session: str | None = None
    subtree: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    held_s: float = 0.0
    parked_s: float = 0.0
    latency_s: float | None = None
    outcome: str
    model: str | None = None


class TurnsPage(Wire):
    turns: list[TurnDoc]
    next_after_id: int
    """Pass back as ``after_id`` for the next page (the last id returned, or ``after_id`` when empty)."""


class HealthDoc(Wire):
    status: HealthStatus
    uptime_s: float
    engine: str
    read_only: bool
    reasons: list[str] = []


__all__ = [
    "AuditEntry",
    "BacklogDoc",
    "BudgeterDoc",
    "CompactionDecision",
    "CompactionStateDoc",
    "ControlMode",
    "DecisionDoc",
    "HealthDoc",
    "HealthStatus",
    "LastTurnsDoc",
    "Percentiles",
    "ReuseDoc",
    "SessionDoc",
    "SessionDocState",
    "SessionState",
    "SessionsPage",
    "StateDoc",
    "StateSession",
    "TrafficDoc",
    "TurnDoc",
    "TurnsPage",
    "Wire",
]
