"""An engine's state as the pages show it: down > stale > collapsed > thin-reuse > healthy.

This classifies what the collectors, sidecars and alert rules already decided
(target up/down, data age, a firing collapse alert, the sidecar's regime); it
computes no policy of its own. Each state carries the reason in words, so the
cause sits next to the effect.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboard.frames import EngineRef, TargetHealth

STATES = ("down", "stale", "collapsed", "thin-reuse", "healthy", "unknown")
BADGE = {"down": "DOWN", "stale": "STALE", "collapsed": "COLLAPSED", "thin-reuse": "THIN-REUSE",
         "healthy": "healthy", "unknown": "unknown"}
COLOR = {"DOWN": "#f8d0d0", "STALE": "#e0e0e0", "COLLAPSED": "#fbd9b5", "THIN-REUSE": "#fbf0b5",
         "healthy": "#d5f0d5", "unknown": "#e0e0e0"}


@dataclass(frozen=True)
class EngineStatus:
    state: str
    reason: str

    @property
    def badge(self) -> str:
        return BADGE.get(self.state, self.state)


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


def collectors_alive(last_beat_ts: float | None, now: float, stale_after: float) -> bool:
    return last_beat_ts is not None and now - last_beat_ts <= stale_after


def engine_status(ref: EngineRef, health: dict[int, TargetHealth], *, now: float, stale_after: float,
                  collectors_ok: bool, collectors_age: float | None, firing_rules: set[str],
                  regime: str | None) -> EngineStatus:
    """Classify one engine; `firing_rules` are the rules firing for its targets."""
    parts = [health[t] for t in ref.target_ids if t in health]
    if not parts:
        return EngineStatus("unknown", "never scraped")
    if not collectors_ok:
        last = [h for h in parts if not h.up]
        known = "last known: down" if last else "last known: up"
        return EngineStatus("stale", f"collectors' heartbeat is {age_text(collectors_age)}; nothing below is "
                                     f"current ({known})")
    down = [h for h in parts if not h.up]
    if down:
        h = down[0]
        since = age_text(now - h.last_success_ts) if h.last_success_ts else "never up"
        error = f": {h.last_error}" if h.last_error else ""
        return EngineStatus("down", f"{h.role} {h.name} not answering{error} (last good scrape {since})")
    oldest = min((h.last_success_ts or 0.0) for h in parts)
    if now - oldest > stale_after:
        h = min(parts, key=lambda x: x.last_success_ts or 0.0)
        return EngineStatus("stale", f"{h.role} {h.name}: last good scrape {age_text(now - oldest)}")
    if "collapse" in firing_rules:
        return EngineStatus("collapsed", "alert collapse firing")
    if regime == "thin-reuse":
        return EngineStatus("thin-reuse", "sidecar reports the thin-reuse regime (D above threshold)")
    if "thin-reuse" in firing_rules:
        return EngineStatus("thin-reuse", "alert thin-reuse firing (D above threshold)")
    if ref.sidecar_target_id is None:
        return EngineStatus("healthy", "engine up (no sidecar: no R_t/R_r, no controls)")
    return EngineStatus("healthy", "up, fresh data, no collapse alert, normal reuse regime")
