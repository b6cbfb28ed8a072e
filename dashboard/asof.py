"""What a page shows when it is not live (paused, a custom range, or the moment of a link): the state *as of*
that time, never now dressed up as then.

- `moment`: the time a page's state is read at: None when live (read the newest), the moment of a link
  (``?at=``), else the end of the paused or custom window (``?to=``).
- From the stored history, as of that time: samples (`dashboard.data.latest` with ``as_of``), each target's
  health from its ``up`` samples (`dashboard.data.health` with ``as_of``), the alerts firing then
  (`dashboard.frames.firing_at`), the collectors' last scrape then (`last_scrape`), and the sidecar's regime
  from its ``thin_reuse`` samples (`sidecar_states_at`).
- The database keeps only the latest state of a sidecar's ``/state`` document (operator deferral, warnings,
  per-model table), of its sessions and of its subtrees. A page shows those only labelled `now_label`
  ("now, not as of <time>") or hides them with a one-line caption (`now_only`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dashboard.frames import Latest, TargetHealth
from dashboard.timerange import TimeWindow
from dashboard.ui import fmt_ts


def moment(window: TimeWindow) -> float | None:
    """None for a live window; else the time its state is read at (the link's moment, or the window's end)."""
    if window.live:
        return None
    return window.at if window.at is not None else window.end


def sidecar_states_at(latest: Latest, sidecar_ids: Iterable[int | None]) -> dict[int, dict[str, Any]]:
    """Per sidecar, what the stored samples say of its ``/state`` at the time `latest` was read as of:
    ``{"ts", "regime"}`` from its ``thin_reuse`` sample (1: "thin-reuse", 0: "normal"; no sample: left
    out). No ``state`` document: R_t, R_r, D and the queue then come from the same as-of samples."""
    out: dict[int, dict[str, Any]] = {}
    for sid in sidecar_ids:
        got = latest.get(sid, "thin_reuse")
        if sid is not None and got is not None:
            out[sid] = {"ts": got[0], "regime": "thin-reuse" if got[1] >= 0.5 else "normal"}
    return out


def last_scrape(health: Mapping[int, TargetHealth]) -> float | None:
    """The collectors' newest scrape in an as-of health map (they write ``up`` on every scrape): whether they
    were running then, where the live page reads their heartbeat."""
    return max((h.last_scrape_ts for h in health.values() if h.last_scrape_ts is not None), default=None)


def now_label(at: float) -> str:
    return f"now, not as of {fmt_ts(at)}"


def now_only(what: str, at: float) -> str:
    """The caption of a value shown (or hidden) in a paused view because only its latest state is kept."""
    return (
        f"{what}: {now_label(at)}. The database keeps only the sidecar's latest report of it, "
        "not its history."
    )
