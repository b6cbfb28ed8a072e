"""An engine's state as the pages show it, with the cause and the next step in words.

State precedence (the worst state that holds is shown; rows sort by it, worst first):

    down > stale > collapsed > queueing > thin-reuse > healthy > unknown

- **down**: a target of the engine (engine or sidecar) is not answering; the reason names which one
  and when it last answered. Each target's own last good scrape is judged, never the newest of the two.
- **stale**: the collectors' heartbeat is old (nothing is current), or a target answers but has no
  fresh sample.
- **collapsed**: the ``collapse`` alert fires.
- **queueing**: sessions wait at the sidecar for admission and the oldest has waited more than the
  ``admission-wait`` limit (or that alert fires): the hit rate may look fine, users are waiting.
- **thin-reuse**: the sidecar's regime, judged from the same ``/state`` snapshot as the R_t, R_r and D
  shown beside it (so the badge never disagrees with its row). A ``thin-reuse`` alert still firing
  after the regime left is said in the reason, not in the badge.
- **healthy**: none of the above.

This classifies what the collectors, sidecars and alert rules already decided; it computes no policy
of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboard.frames import EngineRef, TargetHealth

STATES = ("down", "stale", "collapsed", "queueing", "thin-reuse", "healthy", "unknown")
RANK = {state: i for i, state in enumerate(STATES)}
BADGE = {
    "down": "DOWN",
    "stale": "STALE",
    "collapsed": "COLLAPSED",
    "queueing": "QUEUEING",
    "thin-reuse": "THIN-REUSE",
    "healthy": "healthy",
    "unknown": "unknown",
}
COLOR = {
    "DOWN": "#f8d0d0",
    "STALE": "#e0e0e0",
    "COLLAPSED": "#fbd9b5",
    "QUEUEING": "#fde2c4",
    "THIN-REUSE": "#fbf0b5",
    "healthy": "#d5f0d5",
    "unknown": "#e0e0e0",
}
# The alert rule behind each state: its fix pages and runbook section are the next step.
STATE_RULE = {
    "down": "target-down",
    "stale": "stale-data",
    "collapsed": "collapse",
    "queueing": "admission-wait",
    "thin-reuse": "thin-reuse",
}
NEXT_STEP = {
    "down": "check the process and host of the target named (Engine page)",
    "stale": "check the collectors (sidebar heartbeat) and the target's scrape errors (Engine page)",
    "collapsed": "park sessions to empty the pool of stale prefixes: Budgeter page, mode budgeter-park",
    "queueing": "admit more (raise the high band) or add capacity: Budgeter page; who waits: Sessions page",
    "thin-reuse": "defer compaction while reuse is thin: Compaction page",
}


@dataclass(frozen=True)
class Queue:
    """Sessions waiting at the sidecar for admission, and how long the oldest waiting / parked one has."""

    waiting: float | None = None
    oldest_waiting_s: float | None = None
    oldest_parked_s: float | None = None


@dataclass(frozen=True)
class EngineStatus:
    state: str
    reason: str

    @property
    def badge(self) -> str:
        return BADGE.get(self.state, self.state)

    @property
    def rank(self) -> int:
        return RANK.get(self.state, len(STATES))

    @property
    def why(self) -> str:
        """The cause and, when there is something to do, the next step."""
        step = NEXT_STEP.get(self.state)
        return f"{self.reason}. Next: {step}" if step else self.reason


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} d ago"


def last_hit_text(ts: float | None, now: float) -> str:
    """A subtree's last completed turn, as "N s ago"; "never" when it has none.

    The sidecar's tracker reports ``last_seen`` 0 for a subtree it knows only from a turn still in
    flight (``SubtreeTracker.begin``) or from a gate request; that is "never", not 56 years ago.
    """
    if ts is None or ts != ts or ts <= 0:
        return "never"
    return age_text(now - ts)


def duration_text(seconds: float | None) -> str:
    """A duration in words ("42 s", "12 min", "3.5 h")."""
    return "-" if seconds is None else age_text(seconds).removesuffix(" ago")


def collectors_alive(last_beat_ts: float | None, now: float, stale_after: float) -> bool:
    return last_beat_ts is not None and now - last_beat_ts <= stale_after


def engine_status(
    ref: EngineRef,
    health: dict[int, TargetHealth],
    *,
    now: float,
    stale_after: float,
    collectors_ok: bool,
    collectors_age: float | None,
    firing_rules: set[str],
    regime: str | None,
    divergence: float | None = None,
    queue: Queue | None = None,
    admission_wait_s: float | None = None,
) -> EngineStatus:
    """Classify one engine; `firing_rules` are the rules firing for its targets, `regime` and
    `divergence` come from the same sidecar /state snapshot."""
    parts = [health[t] for t in ref.target_ids if t in health]
    if not parts:
        return EngineStatus("unknown", "never scraped")
    if not collectors_ok:
        last = [h for h in parts if not h.up]
        known = "last known: down" if last else "last known: up"
        return EngineStatus(
            "stale",
            f"collectors' heartbeat is {age_text(collectors_age)}; nothing below is current ({known})",
        )
    down = [h for h in parts if not h.up]
    if down:
        h = down[0]
        since = age_text(now - h.last_success_ts) if h.last_success_ts else "never up"
        error = f": {h.last_error}" if h.last_error else ""
        return EngineStatus("down", f"{h.role} {h.name} not answering{error} (its last good scrape {since})")
    if "target-down" in firing_rules:
        return EngineStatus("down", "alert target-down firing (the last scrapes failed)")
    oldest = min((h.last_success_ts or 0.0) for h in parts)
    if now - oldest > stale_after:
        h = min(parts, key=lambda x: x.last_success_ts or 0.0)
        return EngineStatus("stale", f"{h.role} {h.name}: its last good scrape {age_text(now - oldest)}")
    if "collapse" in firing_rules:
        return EngineStatus(
            "collapsed", "alert collapse firing: hit rate fell, throughput fell, backlog growing"
        )
    wait = queue.oldest_waiting_s if queue else None
    over = wait is not None and admission_wait_s is not None and wait > admission_wait_s
    if "admission-wait" in firing_rules or over:
        n = queue.waiting if queue else None
        limit = f" (limit {admission_wait_s:.0f} s)" if admission_wait_s is not None else ""
        return EngineStatus(
            "queueing",
            f"{'?' if n is None else f'{n:.0f}'} sessions waiting at the sidecar, the "
            f"oldest for {duration_text(wait)}{limit}",
        )
    d = f"D = {divergence:.2f}" if divergence is not None else "D"
    if regime == "thin-reuse":
        return EngineStatus("thin-reuse", f"sidecar reports the thin-reuse regime ({d})")
    if regime is None and "thin-reuse" in firing_rules:
        return EngineStatus("thin-reuse", f"alert thin-reuse firing ({d} above threshold)")
    note = ""
    if "thin-reuse" in firing_rules:
        note = f"; alert thin-reuse still firing until {d} stays below its exit threshold"
    if queue is not None and (queue.waiting or 0) > 0:
        note += f"; {queue.waiting:.0f} waiting at the sidecar (oldest {duration_text(wait)})"
    if ref.sidecar_target_id is None:
        return EngineStatus("healthy", "engine up (no sidecar: no R_t/R_r, no controls)" + note)
    return EngineStatus("healthy", "up, fresh data, no collapse alert, normal reuse regime" + note)
