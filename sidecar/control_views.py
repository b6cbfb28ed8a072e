"""Read views of the control plane: the documents of /state, /sessions and /subtrees.

Views never advance the regime: they show the regime the clock-driven tick last judged.
"""

from __future__ import annotations

from typing import Any

from core.budgeter import ADMITTED, PARKED, WAITING
from core.compaction import pinned_subtrees
from core.risk import RiskSettings

from .control_state import PlaneState, SessionExtra

PROJECTION_HORIZON_S = RiskSettings().projection_horizon_s

CACHED_FLAG_WARNING = (
    "{unknown} of {turns} turns in the window carry no usage.prompt_tokens_details.cached_tokens; they count as "
    "unknown, not as misses. Start vLLM with --enable-prompt-tokens-details (SGLang: --enable-cache-report)."
)


class Views(PlaneState):
    """Mixin of ControlPlane: documents for the read routes."""

    def budgeter_settings(self) -> dict[str, Any]:
        cfg = self.budgeter.config
        return {
            "mode": cfg.mode,
            "low": cfg.low,
            "high": cfg.high,
            "session_cap": cfg.session_cap,
            "latency_limit_s": cfg.latency_limit_s,
        }

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
            "pending_prompt_tokens": s.inflight_prompt,
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
        out = [
            self._session_doc(s, self.extras.get(s.id) or SessionExtra()) for s in self.budgeter.sessions()
        ]
        if include_ended:
            out.extend(dict(r) for r in self.ended)
        if state is not None:
            out = [r for r in out if r["state"] == state]
        return out

    def sessions_page(
        self,
        *,
        updated_after: float | None,
        cursor: tuple[float, str] | None,
        limit: int,
        include_ended: bool = True,
        state: str | None = None,
    ) -> tuple[list[dict[str, Any]], tuple[float, str] | None]:
        """Sessions changed after ``updated_after`` / after ``cursor``, ascending ``(updated_at, id)``;
        -> (page, cursor of the last item when more remain, else None)."""
        bound: tuple[float, str] | None = None
        if updated_after is not None:
            bound = (updated_after, "\U0010ffff" * 2)  # after every id at exactly that time
        if cursor is not None and (bound is None or cursor > bound):
            bound = cursor
        keys: list[tuple[float, str, dict[str, Any] | None]] = [
            (ts, sid, None) for sid, ts in self.updated.items() if bound is None or (ts, sid) > bound
        ]
        if include_ended:
            keys.extend(
                (r["updated_at"], r["id"], r)
                for r in self.ended
                if bound is None or (r["updated_at"], r["id"]) > bound
            )
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
        return (
            max(0.0, now - min(waiting)) if waiting else None,
            max(0.0, now - min(parked)) if parked else None,
        )

    def warnings(self) -> list[str]:
        out = []
        if not self.settings.operator_token:
            out.append("PREFIXOPS_OPERATOR_TOKEN is not set: the control API is read-only")
        if self.budgeter.pool_tokens is None:
            why = f" ({self.pool_error})" if self.pool_error else ""
            out.append(
                f"KV pool size unknown{why}: the budgeter does not act on token bands; "
                "pass --pool-tokens or check the engine's /metrics"
            )
        elif self.pool_error:
            out.append(self.pool_error)
        stats = self.window.stats(self.clock())
        if stats.unknown_turns:
            out.append(CACHED_FLAG_WARNING.format(unknown=stats.unknown_turns, turns=stats.turns))
        if (
            self.engine_error is not None
            and self.engine_error_at is not None
            and self.clock() - self.engine_error_at < self.settings.window_s
        ):
            out.append(f"engine errors in the last {self.settings.window_s:.0f} s; last: {self.engine_error}")
        return out

    def degraded_reasons(self) -> list[str]:
        """Why the sidecar runs degraded (it fails open: traffic keeps flowing)."""
        out = []
        if self.store_error is not None:
            out.append(f"{self.store_error}: control changes are refused")
        if self.pool_error is not None:
            out.append(self.pool_error)
        return out

    def health_doc(self) -> dict[str, Any]:
        reasons = self.degraded_reasons()
        return {
            "status": "degraded" if reasons else "ok",
            "uptime_s": self.clock() - self.started_at,
            "engine": self.settings.engine,
            "read_only": not self.settings.operator_token,
            "reasons": reasons,
        }

    def state_doc(self, include_sessions: bool = False) -> dict[str, Any]:
        """The /state document: counts, not every session (``include_sessions`` embeds them as before)."""
        now = self.clock()
        stats = self.window.stats(now)
        regime = self.regime.regime  # as the last tick judged it
        last = self.last_turns.stats()
        unsessioned = self.unsessioned_window.stats(now)
        counts = self.budgeter.counts()
        pool = self.budgeter.pool_tokens
        demand = self.budgeter.demand_tokens()
        pace = stats.turns / self.window.window_s  # turns/s over the reuse window
        projected = self.budgeter.projected_demand_tokens(now, PROJECTION_HORIZON_S, pace)
        cfg = self.budgeter.config
        acting = cfg.mode in ("session-cap-park", "latency-park", "off") or pool is not None
        oldest_waiting, oldest_parked = self.oldest_waits()
        degraded = self.degraded_reasons()
        reuse: dict[str, Any] = dict(stats.as_dict())
        reuse.update(
            regime=regime,
            window_s=self.window.window_s,
            regime_judged=self.regime.judged,
            regime_enter=self.regime.config.enter,
            regime_exit=self.regime.config.exit,
            regime_min_turns=self.regime.config.min_turns,
        )
        last_doc = last.as_dict()
        last_doc["n"] = self.last_turns.n
        doc: dict[str, Any] = {
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
                "projected_demand_tokens": projected,
                "projected_demand_fraction": (projected / pool) if pool else None,
                "projection_horizon_s": PROJECTION_HORIZON_S,
                "low_tokens": cfg.low * pool if pool else None,
                "high_tokens": cfg.high * pool if pool else None,
                "acting": acting,
                "session_cap": cfg.session_cap,
                "latency_limit_s": cfg.latency_limit_s,
                "recent_latency_s": self.budgeter.recent_latency_s(),
                "default_output_budget": cfg.default_output_budget,
                "park_set": len(self.budgeter.park_set()),
                "chars_per_token": round(self.prompts.chars_per_token(), 4),
                "chars_per_token_source": "learned" if self.prompts.learned else "configured",
            },
            "backlog": {
                "admitted": counts[ADMITTED],
                "parked": counts[PARKED],
                "waiting": counts[WAITING],
                "total": sum(counts.values()),
                "held_requests": self.held_requests,
                "oldest_waiting_s": oldest_waiting,
                "oldest_parked_s": oldest_parked,
                "time_to_admit_s": self.admission_waits.recent(now),
                "park_time_s": self.park_durations.recent(now),
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
            "models": {name: counts.doc() for name, counts in sorted(self.counters.models.items())},
            "compaction": self.compaction_state(),
            "warnings": self.warnings(),
            "health": "degraded" if degraded else "ok",
            "degraded_reasons": degraded,
        }
        if include_sessions:
            doc["sessions"] = [
                {
                    "id": s.id,
                    "state": s.state,
                    "turns": s.turns,
                    "context_tokens": s.context_tokens,
                    "last_cached_fraction": (self.extras.get(s.id) or SessionExtra()).last_cached_fraction,
                }
                for s in self.budgeter.sessions()
            ]
        return doc

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
