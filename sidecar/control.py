"""The sidecar's state: reuse windows, the budgeter, held turns, subtrees, deferrals, audit.

Everything here runs on the event loop thread; decisions are delegated to the pure
core (core.reuse, core.budgeter, core.compaction). The clock is injected.

Holding: a parked or waiting session's next request awaits an ``asyncio.Future``
registered under its session id (no thread per held request). ``release()`` and
``unpark`` resolve it:

- ``"forward"``: the budgeter admitted the session and counted this turn in flight;
- ``"retry"``: another held request of the same session was forwarded first; ask
  the budgeter again (it forwards, as the session now has a turn in flight);
- ``"ended"``: the session was ended while the request was held.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from core.budgeter import (
    ADMITTED,
    PARKED,
    SESSION_STATES,
    WAITING,
    Budgeter,
    BudgeterConfig,
    ConfigError,
    UnknownSession,
)
from core.compaction import (
    CompactionPolicy,
    SubtreeTracker,
    Urgency,
    WarmthConfig,
    decide_compaction,
    pinned_subtrees,
)
from core.reuse import LastTurns, RegimeConfig, RegimeDetector, TimeWindow, normalise_turn

from .settings import Settings
from .store import Store

log = logging.getLogger(__name__)

CACHED_FLAG_WARNING = (
    "{unknown} of {turns} turns in the window carry no usage.prompt_tokens_details.cached_tokens; they count as "
    "unknown, not as misses. Start vLLM with --enable-prompt-tokens-details (SGLang: --enable-cache-report)."
)


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

    def request(self, endpoint: str, outcome: str) -> None:
        key = (endpoint, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1


class ControlPlane:
    def __init__(self, settings: Settings, store: Store | None, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.started_at = clock()
        self.window = TimeWindow(settings.window_s)
        self.unsessioned_window = TimeWindow(settings.window_s)
        self.last_turns = LastTurns(settings.last_n)
        regime_config = RegimeConfig(settings.regime_enter, settings.regime_exit, settings.regime_min_turns)
        self.regime = RegimeDetector(regime_config)
        self.subtrees = SubtreeTracker(WarmthConfig(settings.warmth_window_s, settings.warmth_floor))
        self.compaction_policy = CompactionPolicy(settings.top_k_pinned)
        self.extras: dict[str, SessionExtra] = {}
        self.ended: deque[dict[str, Any]] = deque(maxlen=settings.ended_keep)
        self.deferral: Deferral | None = None
        self.counters = Counters()
        self.decision_counts: dict[tuple[str, str], int] = {}
        self._held: dict[str, list[asyncio.Future[str]]] = {}
        self.updated: dict[str, float] = {}  # session id -> when its document last changed
        self.held_requests = 0
        self.in_flight = 0
        self.unsessioned_in_flight = 0
        self.pool_source: str | None = None
        self.pool_error: str | None = None
        self.engine_kind: str | None = None
        self.engine_error: str | None = None
        self.engine_error_at: float | None = None
        self._dirty = False
        self._last_persist = 0.0
        self._persisted: dict[str, tuple[Any, ...]] = {}
        self._persisted_config: dict[str, Any] | None = None
        self.restored = False
        self.budgeter = self._restore_budgeter()
        self._restore_deferral()
        if settings.pool_tokens is not None:
            self.budgeter.set_pool(settings.pool_tokens)
            self.pool_source = "flag"
        if store is not None:
            self.decision_counts = store.decision_counts()

    # ------------------------------------------------------------ restore
    def _default_config(self) -> BudgeterConfig:
        s = self.settings
        return BudgeterConfig(mode=s.mode, low=s.low, high=s.high, session_cap=s.session_cap,
                              latency_limit_s=s.latency_limit_s, default_output_budget=s.default_output_budget)

    def _restore_budgeter(self) -> Budgeter:
        flags = self._default_config()
        if self.store is None:
            return Budgeter(flags, pool_tokens=None)
        saved_config = self.store.get("budgeter_config")
        saved_sessions = self.store.load_sessions()
        if not saved_config and not saved_sessions:
            return Budgeter(flags, pool_tokens=None)
        try:
            budgeter = Budgeter.from_dict({"config": saved_config or flags.to_dict(), "pool_tokens": None,
                                           "sessions": saved_sessions})
        except (ConfigError, TypeError, ValueError, KeyError) as exc:
            log.error("state db unreadable (%s); starting from command-line settings", exc)
            return Budgeter(flags, pool_tokens=None)
        self._persisted = {s.id: self._session_key(s) for s in budgeter.sessions()}
        self._persisted_config = budgeter.config.to_dict()
        self.restored = True
        cfg = budgeter.config
        # Operator overrides (mode, bands) survive restarts; other settings follow the command line.
        budgeter.set_config(flags.replace(mode=cfg.mode, low=cfg.low, high=cfg.high,
                                          session_cap=cfg.session_cap, latency_limit_s=cfg.latency_limit_s))
        if (cfg.mode, cfg.low, cfg.high) != (flags.mode, flags.low, flags.high):
            log.warning("restored operator settings mode=%s low=%s high=%s from the state db (command line says "
                        "mode=%s low=%s high=%s)", cfg.mode, cfg.low, cfg.high, flags.mode, flags.low, flags.high)
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
            self.deferral = Deferral(until=float(saved["deferred_until"]), reason=str(saved.get("reason", "")),
                                     actor=str(saved.get("actor", "")), since=float(saved.get("since", 0.0)))

    # -------------------------------------------------------- persistence
    def persist(self, force: bool = False) -> None:
        if self.store is None:
            return
        now = self.clock()
        if not force and (not self._dirty or now - self._last_persist < self.settings.persist_every_s):
            return
        # Only what changed since the last write: a control action on one of 2,000 sessions writes one row.
        config = self.budgeter.config.to_dict()
        if config != self._persisted_config:
            self.store.put("budgeter_config", config, now)
            self._persisted_config = config
        upserts = []
        seen = set()
        for s in self.budgeter.sessions():
            seen.add(s.id)
            key = self._session_key(s)
            if self._persisted.get(s.id) != key:
                upserts.append((s.id, vars(s)))
                self._persisted[s.id] = key
        deletes = [sid for sid in self._persisted if sid not in seen]
        for sid in deletes:
            del self._persisted[sid]
        self.store.write_sessions(upserts, deletes)
        self._dirty = False
        self._last_persist = now

    def persist_session(self, session_id: str) -> None:
        """Write one session's row (and the config) now: a control action must survive a SIGKILL."""
        if self.store is None:
            return
        now = self.clock()
        config = self.budgeter.config.to_dict()
        if config != self._persisted_config:
            self.store.put("budgeter_config", config, now)
            self._persisted_config = config
        if session_id in self.budgeter:
            s = self.budgeter.session(session_id)
            self._persisted[session_id] = self._session_key(s)
            self.store.write_sessions([(session_id, vars(s))], [])
        elif self._persisted.pop(session_id, None) is not None:
            self.store.write_sessions([], [session_id])

    @staticmethod
    def _session_key(s: Any) -> tuple[Any, ...]:
        return (s.state, s.context_tokens, s.turns, s.manual, s.pinned, s.parked_since, s.admitted_at,
                s.output_budget, s.last_activity, s.arrived_at)

    def _persist_deferral(self) -> None:
        if self.store is None:
            return
        d = self.deferral
        value = None if d is None else {"deferred_until": d.until, "reason": d.reason, "actor": d.actor,
                                        "since": d.since}
        self.store.put("compaction", value or {"deferred_until": None}, self.clock())

    # ------------------------------------------------------------ traffic
    def request_turn(self, session_id: str, prompt_tokens: int, output_budget: int | None) -> str:
        self._dirty = True
        now = self.clock()
        self.updated[session_id] = now
        return self.budgeter.request_turn(session_id, now, prompt_tokens, output_budget)

    def touch(self, session_id: str) -> None:
        """The session's document changed: incremental /sessions readers must see it again."""
        self.updated[session_id] = self.clock()

    async def hold(self, session_id: str, disconnected: Callable[[], Awaitable[Any]]) -> str:
        """Wait until the session's held turn is released; -> forward | retry | ended | timeout | disconnected."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._held.setdefault(session_id, []).append(future)
        self.held_requests += 1
        self.counters.held_total += 1
        watcher = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait((future, watcher), timeout=self.settings.max_hold_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            self.held_requests -= 1
        if future.done() and not future.cancelled():
            return future.result()
        future.cancel()
        waiting = self._held.get(session_id)
        if waiting is not None:
            if future in waiting:
                waiting.remove(future)
            if not waiting:
                del self._held[session_id]
                self.budgeter.cancel_held(session_id)
        if watcher.done() and not watcher.cancelled():
            self.counters.hold_disconnects += 1
            return "disconnected"
        self.counters.hold_timeouts += 1
        return "timeout"

    def _wake(self, session_id: str, outcome: str) -> None:
        futures = self._held.pop(session_id, [])
        first = True
        for future in futures:
            if future.done():
                continue
            if outcome == "forward" and not first:
                future.set_result("retry")
            else:
                future.set_result(outcome)
            first = False
        if outcome == "forward" and first:
            # The budgeter counted a held turn in flight but its client is gone: give it back.
            self.budgeter.turn_finished(session_id, self.clock(), 0, 0, None, ok=False)

    def release(self) -> list[str]:
        released = self.budgeter.release(self.clock())
        for session_id in released:
            self.touch(session_id)
            self._wake(session_id, "forward")
        if released:
            self._dirty = True
        return released

    def turn_done(self, session_id: str | None, prompt_tokens: int | None, cached_tokens: int | None,
                  completion_tokens: int | None, latency_s: float, ok: bool, subtree: str | None) -> None:
        now = self.clock()
        prompt = prompt_tokens if prompt_tokens is not None and prompt_tokens >= 0 else None
        if ok and prompt is not None:
            turn = normalise_turn(now, prompt, cached_tokens)
            self.window.add(turn)
            self.last_turns.add(turn)
            if session_id is None:
                self.unsessioned_window.add(turn)
            self.regime.update(self.window.stats(now))
            self.counters.turns += 1
            self.counters.prompt_tokens += turn.prompt_tokens
            self.counters.completion_tokens += max(0, completion_tokens or 0)
            if turn.cached_tokens is None:
                self.counters.unknown_turns += 1
            else:
                self.counters.cached_tokens += turn.cached_tokens
            if subtree is not None:
                self.subtrees.record(subtree, now, turn.prompt_tokens, turn.cached_tokens)
        if session_id is None:
            return
        self._dirty = True
        self.updated[session_id] = now
        extra = self.extras.setdefault(session_id, SessionExtra())
        extra.requests += 1
        if subtree is not None:
            extra.subtree = subtree
        if ok and prompt is not None:
            extra.prompt_tokens += prompt
            extra.last_prompt_tokens = prompt
            extra.last_completion_tokens = max(0, completion_tokens or 0)
            if cached_tokens is not None:
                extra.cached_tokens += min(prompt, max(0, cached_tokens))
                extra.last_cached_fraction = (min(prompt, max(0, cached_tokens)) / prompt) if prompt else None
        else:
            extra.failed_turns += 1
        self.budgeter.turn_finished(session_id, now, prompt or 0, max(0, completion_tokens or 0), latency_s,
                                    ok=ok and prompt is not None)

    def end_session(self, session_id: str, reason: str) -> dict[str, Any] | None:
        now = self.clock()
        try:
            before = self.budgeter.session(session_id)
        except UnknownSession:
            return None
        self.budgeter.end_session(session_id, now)
        self._wake(session_id, "ended")
        extra = self.extras.pop(session_id, None) or SessionExtra()
        record = self._session_doc(before, extra)
        record.update(state="ended", ended_at=now, end_reason=reason, held=0, updated_at=now)
        self.updated.pop(session_id, None)
        self.ended.append(record)
        self.counters.sessions_ended[reason] = self.counters.sessions_ended.get(reason, 0) + 1
        self._dirty = True
        return record

    # ------------------------------------------------------------ periodic
    def tick(self) -> None:
        now = self.clock()
        for session_id in self.budgeter.idle_sessions(now, self.settings.idle_timeout_s):
            if session_id in self._held:
                continue
            self.end_session(session_id, "idle")
            log.info("session %r ended after %.0f s idle", session_id, self.settings.idle_timeout_s)
        self.regime.update(self.window.stats(now))
        self.release()
        if self.deferral is not None and now >= self.deferral.until:
            log.info("compaction deferral by %r ended", self.deferral.actor)
            self.deferral = None
            self._persist_deferral()
        self.persist()

    def set_pool(self, tokens: int | None, kind: str | None, error: str | None) -> None:
        if self.settings.pool_tokens is not None:
            self.engine_kind = kind or self.engine_kind
            return
        if tokens is not None:
            if tokens != self.budgeter.pool_tokens:
                log.info("KV pool: %d tokens (%s)", tokens, kind)
            self.budgeter.set_pool(tokens)
            self.pool_source = "engine"
            self.pool_error = None
            self.engine_kind = kind
        else:
            if self.budgeter.pool_tokens is None:
                self.pool_error = error
            else:
                # Keep the last known pool: a missed scrape must not switch the budgeter off.
                self.pool_error = f"{error} (keeping the last known pool size)"

    def engine_failed(self, message: str) -> None:
        self.counters.engine_errors += 1
        self.engine_error = message
        self.engine_error_at = self.clock()

    # --------------------------------------------------------- operator
    def audit(self, actor: str, role: str, action: str, params: Any, before: Any, after: Any) -> int:
        if self.store is None:
            return 0
        return self.store.append_audit(self.clock(), actor, role, action, params, before, after)

    def budgeter_settings(self) -> dict[str, Any]:
        cfg = self.budgeter.config
        return {"mode": cfg.mode, "low": cfg.low, "high": cfg.high, "session_cap": cfg.session_cap,
                "latency_limit_s": cfg.latency_limit_s}

    def update_budgeter(self, changes: dict[str, Any], actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.budgeter_settings()
        new = self.budgeter.config.replace(**changes)  # ConfigError propagates: nothing changed
        self.budgeter.set_config(new)
        after = self.budgeter_settings()
        self._dirty = True
        self.persist(force=True)
        audit_id = self.audit(actor, role, "budgeter.update", changes, before, after)
        log.info("budgeter settings changed by %r: %s -> %s", actor, before, after)
        self.release()
        return after, audit_id

    def park(self, session_id: str, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.session_doc(session_id)  # UnknownSession propagates
        self.budgeter.park(session_id, self.clock(), manual=True)
        self.touch(session_id)
        after = self.session_doc(session_id)
        self._dirty = True
        self.persist_session(session_id)
        audit_id = self.audit(actor, role, "session.park", {"session": session_id}, before, after)
        log.info("session %r parked by %r", session_id, actor)
        self.release()  # its demand left the total: queued sessions may fit now
        return after, audit_id

    def unpark(self, session_id: str, pin: bool, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.session_doc(session_id)
        had_held = self.budgeter.unpark(session_id, self.clock(), pin=pin)
        self.touch(session_id)
        if had_held:
            self._wake(session_id, "forward")
        after = self.session_doc(session_id)
        self._dirty = True
        self.persist_session(session_id)
        audit_id = self.audit(actor, role, "session.unpark", {"session": session_id, "pin": pin}, before, after)
        log.info("session %r unparked by %r (pin=%s)", session_id, actor, pin)
        return after, audit_id

    def delete_session(self, session_id: str, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.session_doc(session_id)
        record = self.end_session(session_id, "deleted")
        assert record is not None
        self.persist_session(session_id)
        audit_id = self.audit(actor, role, "session.end", {"session": session_id}, before, record)
        return record, audit_id

    def compaction_state(self) -> dict[str, Any]:
        now = self.clock()
        d = self.deferral if self.deferral is not None and now < self.deferral.until else None
        granted = sum(n for (dec, _), n in self.decision_counts.items() if dec == "granted")
        deferred = sum(n for (dec, _), n in self.decision_counts.items() if dec == "deferred")
        return {
            "deferred_until": None if d is None else d.until,
            "deferred_reason": None if d is None else d.reason,
            "deferred_by": None if d is None else d.actor,
            "granted_total": granted,
            "deferred_total": deferred,
            "top_k_pinned": self.compaction_policy.top_k_pinned,
            "warmth_floor": self.subtrees.warmth.floor,
            "warmth_window_s": self.subtrees.warmth.window_s,
        }

    def defer_compaction(self, until: float, reason: str, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.compaction_state()
        self.deferral = Deferral(until=until, reason=reason, actor=actor, since=self.clock())
        self._persist_deferral()
        after = self.compaction_state()
        audit_id = self.audit(actor, role, "compaction.defer", {"until": until, "reason": reason}, before, after)
        return after, audit_id

    def allow_compaction(self, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.compaction_state()
        self.deferral = None
        self._persist_deferral()
        after = self.compaction_state()
        audit_id = self.audit(actor, role, "compaction.allow", {}, before, after)
        return after, audit_id

    def request_compaction(self, targets: list[str], urgency: Urgency, reason: str,
                           request_id: str) -> list[dict[str, Any]]:
        now = self.clock()
        window = self.window.stats(now)
        self.regime.update(window)
        regime = self.regime.regime
        deferred_until = self.deferral.until if self.deferral is not None else None
        stats = self.subtrees.stats(now)
        decisions = decide_compaction(targets, stats, regime=regime, urgency=urgency, now=now,
                                      deferred_until=deferred_until, policy=self.compaction_policy)
        rows: list[dict[str, Any]] = [{
            "ts": now, "request_id": request_id, "subtree_id": d.subtree_id, "decision": d.decision,
            "reason": d.reason, "urgency": urgency, "regime": regime, "request_reason": reason,
            "warm": d.warm, "recent_hits": d.recent_hits, "recent_cached_tokens": d.recent_cached_tokens,
            "token_weighted": window.token_weighted, "divergence": window.divergence,
        } for d in decisions]
        ids = self.store.append_decisions(rows) if self.store is not None else [0] * len(rows)
        for row, row_id in zip(rows, ids, strict=True):
            row["id"] = row_id
            key = (row["decision"], urgency)
            self.decision_counts[key] = self.decision_counts.get(key, 0) + 1
        log.info("compaction request %s (%s, %s): %s", request_id, urgency, regime,
                 ", ".join(f"{r['subtree_id']!r}={r['decision']}" for r in rows))
        return rows

    # ------------------------------------------------------------- views
    def _session_doc(self, s: Any, extra: SessionExtra) -> dict[str, Any]:
        return {
            "id": s.id,
            "state": s.state,
            "context_tokens": s.context_tokens,
            "turns": s.turns,
            "manual": s.manual,
            "pinned": s.pinned,
            "held": len(self._held.get(s.id, ())),
            "in_flight": s.inflight,
            "demand_tokens": s.demand_tokens if s.state == ADMITTED else 0,
            "output_budget": s.output_budget,
            "last_cached_fraction": extra.last_cached_fraction,
            "last_prompt_tokens": extra.last_prompt_tokens,
            "last_completion_tokens": extra.last_completion_tokens,
            "prompt_tokens": extra.prompt_tokens,
            "cached_tokens": extra.cached_tokens,
            "failed_turns": extra.failed_turns,
            "subtree": extra.subtree,
            "parked_since": s.parked_since,
            "admitted_at": s.admitted_at,
            "arrived_at": s.arrived_at,
            "last_activity": s.last_activity,
            "last_latency_s": s.last_latency_s,
            "updated_at": self.updated.get(s.id, s.last_activity),
        }

    def session_doc(self, session_id: str) -> dict[str, Any]:
        s = self.budgeter.session(session_id)
        return self._session_doc(s, self.extras.get(session_id) or SessionExtra())

    def sessions_doc(self, include_ended: bool = True, state: str | None = None) -> list[dict[str, Any]]:
        out = [self._session_doc(s, self.extras.get(s.id) or SessionExtra()) for s in self.budgeter.sessions()]
        if include_ended:
            out.extend(dict(r) for r in self.ended)
        if state is not None:
            out = [r for r in out if r["state"] == state]
        return out

    def sessions_page(self, *, updated_after: float | None, cursor: tuple[float, str] | None, limit: int,
                      include_ended: bool = True, state: str | None = None) -> tuple[list[dict[str, Any]],
                                                                                      tuple[float, str] | None]:
        """Sessions changed after ``updated_after`` / after ``cursor``, ascending ``(updated_at, id)``;
        -> (page, cursor of the last item when more remain, else None)."""
        bound: tuple[float, str] | None = None
        if updated_after is not None:
            bound = (updated_after, "\U0010ffff" * 2)  # after every id at exactly that time
        if cursor is not None and (bound is None or cursor > bound):
            bound = cursor
        keys: list[tuple[float, str, dict[str, Any] | None]] = [
            (ts, sid, None) for sid, ts in self.updated.items() if bound is None or (ts, sid) > bound]
        if include_ended:
            keys.extend((r["updated_at"], r["id"], r) for r in self.ended
                        if bound is None or (r["updated_at"], r["id"]) > bound)
        keys.sort(key=lambda k: (k[0], k[1]))
        page: list[dict[str, Any]] = []
        last: tuple[float, str] | None = None
        more = False
        for ts, sid, record in keys:
            if record is None:
                if sid not in self.budgeter:
                    continue
                doc = self.session_doc(sid)
            else:
                doc = dict(record)
            if state is not None and doc["state"] != state:
                continue
            if len(page) >= limit:
                more = True
                break
            page.append(doc)
            last = (ts, sid)
        return page, (last if more else None)

    def oldest_waits(self) -> tuple[float | None, float | None]:
        """(seconds the oldest waiting session has waited, seconds the oldest parked one has been parked)."""
        counts = self.budgeter.counts()
        if not counts[WAITING] and not counts[PARKED]:
            return None, None
        now = self.clock()
        waiting: list[float] = []
        parked: list[float] = []
        for s in self.budgeter.sessions():
            if s.state == WAITING:
                waiting.append(s.arrived_at)
            elif s.state == PARKED and s.parked_since is not None:
                parked.append(s.parked_since)
        return (max(0.0, now - min(waiting)) if waiting else None,
                max(0.0, now - min(parked)) if parked else None)

    def warnings(self) -> list[str]:
        out = []
        if not self.settings.operator_token:
            out.append("PREFIXOPS_OPERATOR_TOKEN is not set: the control API is read-only")
        if self.budgeter.pool_tokens is None:
            why = f" ({self.pool_error})" if self.pool_error else ""
            out.append(f"KV pool size unknown{why}: the budgeter does not act on token bands; "
                       "pass --pool-tokens or check the engine's /metrics")
        elif self.pool_error:
            out.append(self.pool_error)
        stats = self.window.stats(self.clock())
        if stats.unknown_turns:
            out.append(CACHED_FLAG_WARNING.format(unknown=stats.unknown_turns, turns=stats.turns))
        if self.engine_error is not None and self.engine_error_at is not None \
                and self.clock() - self.engine_error_at < self.settings.window_s:
            out.append(f"engine errors in the last {self.settings.window_s:.0f} s; last: {self.engine_error}")
        return out

    def state_doc(self) -> dict[str, Any]:
        now = self.clock()
        stats = self.window.stats(now)
        regime = self.regime.update(stats)
        last = self.last_turns.stats()
        unsessioned = self.unsessioned_window.stats(now)
        counts = self.budgeter.counts()
        pool = self.budgeter.pool_tokens
        demand = self.budgeter.demand_tokens()
        cfg = self.budgeter.config
        acting = cfg.mode in ("session-cap-park", "latency-park", "off") or pool is not None
        oldest_waiting, oldest_parked = self.oldest_waits()
        reuse: dict[str, Any] = dict(stats.as_dict())
        reuse.update(regime=regime, window_s=self.window.window_s, regime_judged=self.regime.judged,
                     regime_enter=self.regime.config.enter, regime_exit=self.regime.config.exit,
                     regime_min_turns=self.regime.config.min_turns)
        last_doc = last.as_dict()
        last_doc["n"] = self.last_turns.n
        return {
            "ts": now,
            "started_at": self.started_at,
            "engine": self.settings.engine,
            "engine_kind": self.engine_kind,
            "read_only": not self.settings.operator_token,
            "restored": self.restored,
            "reuse": reuse,
            "reuse_last_turns": last_doc,
            "budgeter": {
                "mode": cfg.mode,
                "low": cfg.low,
                "high": cfg.high,
                "pool_tokens": pool,
                "pool_source": self.pool_source if pool is not None else None,
                "demand_tokens": demand,
                "demand_fraction": (demand / pool) if pool else None,
                "low_tokens": cfg.low * pool if pool else None,
                "high_tokens": cfg.high * pool if pool else None,
                "acting": acting,
                "session_cap": cfg.session_cap,
                "latency_limit_s": cfg.latency_limit_s,
                "recent_latency_s": self.budgeter.recent_latency_s(),
                "default_output_budget": cfg.default_output_budget,
                "park_set": len(self.budgeter.park_set()),
            },
            "backlog": {
                "admitted": counts[ADMITTED],
                "parked": counts[PARKED],
                "waiting": counts[WAITING],
                "total": sum(counts.values()),
                "held_requests": self.held_requests,
                "oldest_waiting_s": oldest_waiting,
                "oldest_parked_s": oldest_parked,
            },
            "traffic": {
                "in_flight": self.in_flight,
                "turns_total": self.counters.turns,
                "unknown_turns_total": self.counters.unknown_turns,
                "engine_errors_total": self.counters.engine_errors,
                "unsessioned_in_flight": self.unsessioned_in_flight,
                "unsessioned_requests_total": self.counters.unsessioned_requests,
                "unsessioned_turns_in_window": unsessioned.turns,
                "unsessioned_fraction": (unsessioned.turns / stats.turns) if stats.turns else None,
            },
            "compaction": self.compaction_state(),
            "warnings": self.warnings(),
            "sessions": [
                {"id": s.id, "state": s.state, "turns": s.turns, "context_tokens": s.context_tokens,
                 "last_cached_fraction": (self.extras.get(s.id) or SessionExtra()).last_cached_fraction}
                for s in self.budgeter.sessions()
            ],
        }

    def subtrees_doc(self) -> list[dict[str, Any]]:
        now = self.clock()
        stats = self.subtrees.stats(now)
        pinned = set(pinned_subtrees(stats, self.compaction_policy.top_k_pinned))
        out = []
        for s in sorted(stats.values(), key=lambda s: (-s.recent_cached_tokens, s.subtree_id)):
            doc = s.as_dict()
            doc["pinned_under_pressure"] = s.subtree_id in pinned
            out.append(doc)
        return out


def finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


__all__ = ["ControlPlane", "SESSION_STATES", "UnknownSession", "ConfigError"]
