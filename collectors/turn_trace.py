"""The collectors' part of the turn trace (issue 16 item 1): a sidecar's ``GET /turns`` pages into
the ``turns`` table.

Read like the audit and decision logs (`collectors.scrape_sidecar.SidecarScraper._read_log`): from the
newest stored turn (the cursor, advanced only after the writer committed), in pages of
``after_id`` / ``limit``; stored once per (target, log epoch, remote id). Turns are deleted with
the raw samples (`prune`), after ``raw_retention_h``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, delete

from collectors.sidecar_docs import integer, num, text
from db.models import Turn


def turn_row(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """A /turns entry as a ``turns`` row (None without an id)."""
    remote_id = integer(doc.get("id"))
    if remote_id is None:
        return None
    return {
        "remote_id": remote_id,
        "ts": num(doc.get("ts")),
        "session_id": text(doc.get("session"), 256),
        "subtree_id": text(doc.get("subtree"), 256),
        "prompt_tokens": integer(doc.get("prompt_tokens")),
        "cached_tokens": integer(doc.get("cached_tokens")),
        "completion_tokens": integer(doc.get("completion_tokens")),
        "held_s": num(doc.get("held_s")),
        "parked_s": num(doc.get("parked_s")),
        "latency_s": num(doc.get("latency_s")),
        "outcome": text(doc.get("outcome"), 32),
        "model": text(doc.get("model"), 200),
    }


def turns_items(doc: Any) -> Any:
    """The list of a /turns page (``{"turns": [...], "next_after_id": N}``); the doc itself otherwise."""
    return doc.get("turns") if isinstance(doc, Mapping) else doc


def prune(conn: Connection, cutoff: float) -> int:
    """Delete turns older than ``cutoff`` (Unix s); -> rows deleted."""
    return conn.execute(delete(Turn).where(Turn.ts < cutoff)).rowcount or 0
