"""Turn-trace rows for the filled database (tests/dashboard/fill.py): engine ``a``'s sidecar.

Twelve agent sessions take a turn every minute over the last hour, their context growing by 800 tokens a
turn. Healthy: every reusable full block is cached. After the collapse (``COLLAPSE_AGO``): sessions 0-3
are parked between turns (cached 0, parked 60 s), sessions 4-5 use the subtrees compacted at the
collapse (cached 0), the rest find only a quarter of their prefix cached (unattributed).
"""

from __future__ import annotations

from typing import Any

SESSIONS = 12
PERIOD_S = 60.0
GROWTH = 800
COMPLETION = 160


def turn_rows(target_id: int, now: float, collapse_ago: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rid = 0
    for s in range(SESSIONS):
        context = 0
        t = now - 3600 + 5 * s
        first = True
        while t < now - 1:
            prompt = context + GROWTH
            collapsed = t >= now - collapse_ago
            reusable = context // 16 * 16
            parked = collapsed and s < 4
            cached = 0 if first else (reusable if not collapsed else (0 if s < 6 else reusable // 4))
            rid += 1
            rows.append(
                {
                    "target_id": target_id,
                    "epoch": 0,
                    "remote_id": rid,
                    "ts": t,
                    "session_id": f"agent-{s:03d}",
                    "subtree_id": f"system-prompt-{s % 2}" if s in (4, 5) else None,
                    "prompt_tokens": prompt,
                    "cached_tokens": cached,
                    "completion_tokens": COMPLETION,
                    "held_s": 60.0 if parked else 0.0,
                    "parked_s": 60.0 if parked else 0.0,
                    "latency_s": 1.5 if collapsed else 0.4,
                    "outcome": "ok",
                    "model": "agent-8b",
                }
            )
            context = prompt + COMPLETION
            first = False
            t += PERIOD_S
    return rows
