"""The control plane's records (session extras, deferral, counters, turn tickets), its persistence
to the state store (restore at start, write what changed, write one session at once after a control
action; fail open when the store cannot be written) and what it knows of the engine (pool size,
errors)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.budgeter import Budgeter, BudgeterConfig, ConfigError
from core.compaction import CompactionPolicy, SubtreeTracker
from core.prompt_estimate import PromptEstimator
from core.reuse import LastTurns, RegimeDetector, TimeWindow

from .settings import Settings
from .store import Store
from .waits import WaitStats

log = logging.getLogger(__name__)

STORE_RETRY_S = 5.0  # after a failed write, the periodic persist retries this often


class Refused(ValueError):
    """A request the control plane refuses; ``status``, ``kind`` and ``field`` say how to answer it."""

    def __init__(self, status: int, kind: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.field = status, kind, field


@dataclass
class SessionExtra:
    """What the sidecar knows of a session beyond the budgeter's view."""

    subtree: str | None = None
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    last_cached_fraction: float | None = None
    last_prompt_tokens: int | None = None
    last_completion_tokens: int | None = None
    failed_turns: int = 0


@dataclass
class Deferral:
    until: float
    reason: str
    actor: str
    since: float


MAX_MODELS = 32
"""Distinct ``model`` names counted apart; any client can send any name, so the rest share ``(other)``."""


@dataclass
class ModelCounts:
    """Per-model totals since start, by the request's ``model`` (vLLM's metrics do not split by adapter)."""

    turns: int = 0
    errors: int = 0
    known_prompt_tokens: int = 0
    known_cached_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0

    def doc(self) -> dict[str, Any]:
        return {
            "turns_total": self.turns,
            "errors_total": self.errors,
            "prompt_tokens_total": self.known_prompt_tokens,
            "cached_tokens_total": self.known_cached_tokens,
            "completion_tokens_total": self.completion_tokens,
            "token_weighted": (self.known_cached_tokens / self.known_prompt_tokens)
            if self.known_prompt_tokens
            else None,
            "mean_latency_s": (self.latency_s / self.turns) if self.turns else None,
        }


@dataclass
class Counters:
    requests: dict[tuple[str, str], int] = field(default_factory=dict)  # (endpoint, outcome) -> n
    turns: int = 0
    unknown_turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    unsessioned_requests: int = 0
    held_total: int = 0
    hold_timeouts: int = 0
    hold_disconnects: int = 0
    sessions_ended: dict[str, int] = field(default_factory=dict)
    engine_errors: int = 0
    known_turns: int = 0  # turns whose engine reported cached tokens (R_r denominator)
    hit_turns: int = 0  # known turns with cached tokens > 0 (R_r numerator)
    known_prompt_tokens: int = 0  # prompt tokens of known turns (R_t denominator)
    known_cached_tokens: int = 0  # cached tokens of known turns (R_t numerator)
    parks: int = 0  # automatic and manual
    unparks: int = 0  # re-admissions of parked sessions and manual unparks
    usage_rejected: int = 0  # engine usage reports out of range (ignored)
    models: dict[str, ModelCounts] = field(default_factory=dict)

    def model_turn(
        self,
        model: Any,
        prompt: int | None,
        cached: int | None,
        completion: int | None,
        latency_s: float,
        ok: bool,
    ) -> None:
        """Count one finished turn under its request's ``model`` (bounded, see `MAX_MODELS`)."""
        name = model if isinstance(model, str) and model else "(none)"
        if name not in self.models and len(self.models) >= MAX_MODELS:
            name = "(other)"
        counts = self.models.setdefault(name, ModelCounts())
        counts.turns += 1
        counts.errors += 0 if ok else 1
        counts.latency_s += latency_s
        counts.completion_tokens += completion or 0
        if prompt is not None and cached is not None:
            counts.known_prompt_tokens += prompt
            counts.known_cached_tokens += cached

    def request(self, endpoint: str, outcome: str) -> None:
        key = (endpoint, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1


HELD_STATUS = {"ended": 409, "disconnected": 499, "timeout": 503}
UNBOUNDED_TOKENS = 2**40  # the range check for engine usage while the pool size is unknown


@dataclass
class TurnTicket:
    """One proxied completion request, from admission to its finish."""

    path: str
    session_id: str | None
    subtree: str | None
    prompt_estimate: int
    output_budget: int | None
    prompt_chars: int = 0  # the request's text characters (``openai_payload.prompt_size``)
    prompt_ids: int = 0  # and its token ids
    end_session: bool = False
    request_id: str = ""
    started: float = 0.0
    finished: bool = False
    model: Any = None
    held_s: float = 0.0  # admission to forwarding
    parked_s: float = 0.0  # the hold, when its session was parked during it


TurnRefused = Refused  # a turn the sidecar will not admit


class PlaneState:
    """The ControlPlane's attributes, declared once for the type checker of its mixins
    (`Persistence`, `control_views.Views`, `control_holding.Holding`, `control_actions.Operator`);
    `ControlPlane.__init__` sets them."""

    settings: Settings
    store: Store | None
    clock: Callable[[], float]
    started_at: float
    window: TimeWindow
    unsessioned_window: TimeWindow
    last_turns: LastTurns
    regime: RegimeDetector
    subtrees: SubtreeTracker
    compaction_policy: CompactionPolicy
    prompts: PromptEstimator
    extras: dict[str, SessionExtra]
    ended: deque[dict[str, Any]]
    deferral: Deferral | None
    counters: Counters
    decision_counts: dict[tuple[str, str], int]
    _held: dict[str, list[asyncio.Future[str]]]
    held_requests: int
    in_flight: int
    unsessioned_in_flight: int
    pool_source: str | None
    pool_error: str | None
    engine_kind: str | None
    engine_error: str | None
    engine_error_at: float | None
    context_length: int | None
    updated: dict[str, float]
    restored: bool
    budgeter: Budgeter
    _dirty: bool
    _last_persist: float
    _persisted: dict[str, tuple[Any, ...]]
    _persisted_config: dict[str, Any] | None
    store_error: str | None
    _store_failed_at: float
    admission_waits: WaitStats
    park_durations: WaitStats
    _parked_since: dict[str, float]


class Persistence(PlaneState):
    """Mixin of ControlPlane: restore from and write to the state store."""

    # ------------------------------------------------------------ restore
    def _default_config(self) -> BudgeterConfig:
        s = self.settings
        return BudgeterConfig(
            mode=s.mode,
            low=s.low,
            high=s.high,
            session_cap=s.session_cap,
            latency_limit_s=s.latency_limit_s,
            default_output_budget=s.default_output_budget,
        )

    def _restore_budgeter(self) -> Budgeter:
        flags = self._default_config()
        if self.store is None:
            return Budgeter(flags, pool_tokens=None)
        saved_config = self.store.get("budgeter_config")
        saved_sessions = self.store.load_sessions()
        if not saved_config and not saved_sessions:
            return Budgeter(flags, pool_tokens=None)
        try:
            budgeter = Budgeter.from_dict(
                {"config": saved_config or flags.to_dict(), "pool_tokens": None, "sessions": saved_sessions}
            )
        except (ConfigError, TypeError, ValueError, KeyError) as exc:
            log.error("state db unreadable (%s); starting from command-line settings", exc)
            return Budgeter(flags, pool_tokens=None)
        self._persisted = {s.id: self._session_key(s) for s in budgeter.sessions()}
        self._persisted_config = budgeter.config.to_dict()
        self.restored = True
        cfg = budgeter.config
        # Operator overrides (mode, bands) survive restarts; other settings follow the command line.
        budgeter.set_config(
            flags.replace(
                mode=cfg.mode,
                low=cfg.low,
                high=cfg.high,
                session_cap=cfg.session_cap,
                latency_limit_s=cfg.latency_limit_s,
            )
        )
        if (cfg.mode, cfg.low, cfg.high) != (flags.mode, flags.low, flags.high):
            log.warning(
                "restored operator settings mode=%s low=%s high=%s from the state db (command line says "
                "mode=%s low=%s high=%s)",
                cfg.mode,
                cfg.low,
                cfg.high,
                flags.mode,
                flags.low,
                flags.high,
            )
        budgeter.set_pool(None)
        sessions = budgeter.sessions()
        for s in sessions:
            self.extras[s.id] = SessionExtra()
            self.updated[s.id] = s.last_activity
        log.info("restored %d sessions (%s) from the state db", len(sessions), budgeter.counts())
        return budgeter

    def _restore_deferral(self) -> None:
        if self.store is None:
            return
        saved = self.store.get("compaction")
        if saved and saved.get("deferred_until") is not None:
            self.deferral = Deferral(
                until=float(saved["deferred_until"]),
                reason=str(saved.get("reason", "")),
                actor=str(saved.get("actor", "")),
                since=float(saved.get("since", 0.0)),
            )

    # -------------------------------------------------------- persistence
    def persist(self, force: bool = False) -> None:
        """Write what changed since the last write. A store that cannot be written (disk full, locked)
        does not stop anything: the error is kept for /healthz and the write retried later."""
        if self.store is None:
            return
        now = self.clock()
        if not force and (not self._dirty or now - self._last_persist < self.settings.persist_every_s):
            return
        if not force and self.store_error is not None and now - self._store_failed_at < STORE_RETRY_S:
            return
        # Only what changed since the last write: a control action on one of 2,000 sessions writes one row.
        config = self.budgeter.config.to_dict()
        upserts = []
        keys = {}
        for s in self.budgeter.sessions():
            key = self._session_key(s)
            keys[s.id] = key
            if self._persisted.get(s.id) != key:
                upserts.append((s.id, vars(s)))
        deletes = [sid for sid in self._persisted if sid not in keys]
        try:
            if config != self._persisted_config:
                self.store.put("budgeter_config", config, now)
            self.store.write_sessions(upserts, deletes)
        except sqlite3.Error as exc:
            self.store_failed(exc)
            return
        self.store_ok()
        self._persisted_config = config
        for sid, _ in upserts:
            self._persisted[sid] = keys[sid]
        for sid in deletes:
            del self._persisted[sid]
        self._dirty = False
        self._last_persist = now

    def store_failed(self, exc: BaseException) -> None:
        message = f"state store {self.settings.state_db} cannot be written: {type(exc).__name__}: {exc}"
        if message != self.store_error:
            log.error(
                "%s; traffic keeps flowing, control changes are refused until it can be written", message
            )
        self.store_error = message
        self._store_failed_at = self.clock()

    def store_ok(self) -> None:
        if self.store_error is not None:
            log.warning("state store %s writable again", self.settings.state_db)
        self.store_error = None

    def check_writable(self) -> None:
        """Before a control change: refuse it (503 not_persisted) when the store cannot be written."""
        if self.store is None:
            return
        try:
            self.store.probe(self.clock())
        except sqlite3.Error as exc:
            self.store_failed(exc)
            raise Refused(503, "not_persisted", f"{self.store_error}: the change was not applied") from None
        self.store_ok()

    def persist_session(self, session_id: str) -> None:
        """Write one session's row (and the config) now: a control action must survive a SIGKILL."""
        if self.store is None:
            return
        now = self.clock()
        config = self.budgeter.config.to_dict()
        try:
            if config != self._persisted_config:
                self.store.put("budgeter_config", config, now)
                self._persisted_config = config
            if session_id in self.budgeter:
                s = self.budgeter.session(session_id)
                self.store.write_sessions([(session_id, vars(s))], [])
                self._persisted[session_id] = self._session_key(s)
            elif session_id in self._persisted:
                self.store.write_sessions([], [session_id])
                del self._persisted[session_id]
        except sqlite3.Error as exc:
            self.store_failed(exc)

    @staticmethod
    def _session_key(s: Any) -> tuple[Any, ...]:
        return (
            s.state,
            s.context_tokens,
            s.turns,
            s.manual,
            s.pinned,
            s.parked_since,
            s.admitted_at,
            s.output_budget,
            s.last_activity,
            s.arrived_at,
        )

    def _persist_deferral(self) -> None:
        if self.store is None:
            return
        d = self.deferral
        value = (
            None
            if d is None
            else {"deferred_until": d.until, "reason": d.reason, "actor": d.actor, "since": d.since}
        )
        try:
            self.store.put("compaction", value or {"deferred_until": None}, self.clock())
        except sqlite3.Error as exc:
            self.store_failed(exc)

    # ------------------------------------------------------------ engine
    def set_pool(self, tokens: int | None, kind: str | None, error: str | None) -> None:
        if self.settings.pool_tokens is not None:
            self.engine_kind = kind or self.engine_kind
            return
        if tokens is not None:
            if tokens != self.budgeter.pool_tokens:
                log.info("KV pool: %d tokens (%s)", tokens, kind)
            self.budgeter.set_pool(tokens)
            self.cap_demand()
            self.pool_source = "engine"
            self.pool_error = None
            self.engine_kind = kind
        else:
            if self.budgeter.pool_tokens is None:
                self.pool_error = error
            else:
                # Keep the last known pool: a missed scrape must not switch the budgeter off.
                self.pool_error = f"{error} (keeping the last known pool size)"

    def cap_demand(self) -> None:
        """No session's demand above the high band or the engine's context length (budgets restored from
        before the clamp included)."""
        pool = self.budgeter.pool_tokens
        limits = [
            n
            for n in (self.context_length, None if pool is None else int(self.budgeter.config.high * pool))
            if n is not None
        ]
        if limits:
            capped = self.budgeter.cap_demand(min(limits))
            if capped:
                log.warning(
                    "output budgets of %d sessions lowered to fit under %d tokens: %s",
                    len(capped),
                    min(limits),
                    ", ".join(repr(c) for c in capped[:5]),
                )

    def set_context_length(self, tokens: int | None) -> None:
        if tokens is not None and tokens != self.context_length:
            self.context_length = tokens
            self.cap_demand()

    def engine_failed(self, message: str) -> None:
        self.counters.engine_errors += 1
        self.engine_error = message
        self.engine_error_at = self.clock()
