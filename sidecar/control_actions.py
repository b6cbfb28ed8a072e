"""The operator's actions on a control plane: budgeter settings, park, unpark, end a session,
defer and allow compaction; and the compaction requests of clients.

A mixin of `sidecar.control.ControlPlane`. Each action checks first that the state store can be
written (`Refused`, 503, and nothing changes when it cannot), persists what it changed and
records one audit entry (actor, role, parameters with the reason given, the state before and
after); it returns the new state and the audit id. A compaction request is judged by
`core.compaction.decide_compaction` on the regime as the last tick left it, and each decision is
recorded (fail open: answered even when the store cannot record it).
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from core.compaction import Urgency, decide_compaction

from .control_holding import Holding
from .control_state import Deferral, Persistence

log = logging.getLogger(__name__)


class Operator(Holding, Persistence):
    def audit(self, actor: str, role: str, action: str, params: Any, before: Any, after: Any) -> int:
        if self.store is None:
            return 0
        try:
            return self.store.append_audit(self.clock(), actor, role, action, params, before, after)
        except sqlite3.Error as exc:  # rare: check_writable passed a moment ago
            self.store_failed(exc)
            log.error("audit entry lost: %s by %s %r: %s", action, role, actor, params)
            return 0

    def update_budgeter(self, changes: dict[str, Any], actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.budgeter_settings()
        new = self.budgeter.config.replace(**changes)  # ConfigError first: a bad value is a 422 either way
        self.check_writable()  # Refused (503) when it could not be persisted: nothing changed
        self.budgeter.set_config(new)
        after = self.budgeter_settings()
        self._dirty = True
        self.persist(force=True)
        audit_id = self.audit(actor, role, "budgeter.update", changes, before, after)
        log.info("budgeter settings changed by %r: %s -> %s", actor, before, after)
        self.release()
        return after, audit_id

    def park(
        self, session_id: str, actor: str, role: str, reason: str | None = None
    ) -> tuple[dict[str, Any], int]:
        before = self.session_doc(session_id)  # UnknownSession propagates
        self.check_writable()
        self.budgeter.park(session_id, self.clock(), manual=True)
        self._parked(session_id, self.clock())
        self.touch(session_id)
        after = self.session_doc(session_id)
        self._dirty = True
        self.persist_session(session_id)
        params: dict[str, Any] = {"session": session_id}
        if reason is not None:
            params["reason"] = reason
        audit_id = self.audit(actor, role, "session.park", params, before, after)
        log.info("session %r parked by %r", session_id, actor)
        self.release()  # its demand left the total: queued sessions may fit now
        return after, audit_id

    def unpark(self, session_id: str, pin: bool, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.session_doc(session_id)
        self.check_writable()
        had_held = self.budgeter.unpark(session_id, self.clock(), pin=pin)
        self._park_ended(session_id, self.clock(), unparked=True)
        self.touch(session_id)
        if had_held:
            self._wake(session_id, "forward")
        after = self.session_doc(session_id)
        self._dirty = True
        self.persist_session(session_id)
        audit_id = self.audit(
            actor, role, "session.unpark", {"session": session_id, "pin": pin}, before, after
        )
        log.info("session %r unparked by %r (pin=%s)", session_id, actor, pin)
        return after, audit_id

    def delete_session(self, session_id: str, actor: str, role: str) -> tuple[dict[str, Any], int]:
        before = self.session_doc(session_id)
        self.check_writable()
        record = self.end_session(session_id, "deleted")
        assert record is not None
        self.persist_session(session_id)
        audit_id = self.audit(actor, role, "session.end", {"session": session_id}, before, record)
        return record, audit_id

    def defer_compaction(
        self, until: float, reason: str, actor: str, role: str
    ) -> tuple[dict[str, Any], int]:
        before = self.compaction_state()
        self.check_writable()
        self.deferral = Deferral(until=until, reason=reason, actor=actor, since=self.clock())
        self._persist_deferral()
        after = self.compaction_state()
        audit_id = self.audit(
            actor, role, "compaction.defer", {"until": until, "reason": reason}, before, after
        )
        return after, audit_id

    def allow_compaction(self, actor: str, role: str, reason: str = "") -> tuple[dict[str, Any], int]:
        before = self.compaction_state()
        self.check_writable()
        self.deferral = None
        self._persist_deferral()
        after = self.compaction_state()
        audit_id = self.audit(
            actor, role, "compaction.allow", {"reason": reason} if reason else {}, before, after
        )
        return after, audit_id

    def request_compaction(
        self, targets: list[str], urgency: Urgency, reason: str, request_id: str
    ) -> list[dict[str, Any]]:
        now = self.clock()
        window = self.window.stats(now)
        regime = self.regime.regime  # as the last tick judged it: a request does not advance the regime
        deferred_until = self.deferral.until if self.deferral is not None else None
        stats = self.subtrees.stats(now)
        decisions = decide_compaction(
            targets,
            stats,
            regime=regime,
            urgency=urgency,
            now=now,
            deferred_until=deferred_until,
            policy=self.compaction_policy,
        )
        rows: list[dict[str, Any]] = [
            {
                "ts": now,
                "request_id": request_id,
                "subtree_id": d.subtree_id,
                "decision": d.decision,
                "reason": d.reason,
                "urgency": urgency,
                "regime": regime,
                "request_reason": reason,
                "warm": d.warm,
                "recent_hits": d.recent_hits,
                "recent_cached_tokens": d.recent_cached_tokens,
                "token_weighted": window.token_weighted,
                "divergence": window.divergence,
            }
            for d in decisions
        ]
        ids = [0] * len(rows)
        if self.store is not None:
            try:
                ids = self.store.append_decisions(rows)
            except sqlite3.Error as exc:  # fail open: the decisions are answered, not recorded
                self.store_failed(exc)
        for row, row_id in zip(rows, ids, strict=True):
            row["id"] = row_id
            key = (row["decision"], urgency)
            self.decision_counts[key] = self.decision_counts.get(key, 0) + 1
        log.info(
            "compaction request %s (%s, %s): %s",
            request_id,
            urgency,
            regime,
            ", ".join(f"{r['subtree_id']!r}={r['decision']}" for r in rows),
        )
        return rows
