"""The turn trace (issue 16 item 1): one row per turn in the sidecar's state store, served at ``GET /turns``.

A row holds when the turn finished (``ts``), its session and subtree (prefix id), the token counts the
engine reported (prompt, cached, completion), how long the sidecar held it before forwarding
(``held_s``) and of that how long because its session was parked (``parked_s``), the engine's latency,
the outcome (``ok``, ``error``, or ``held_409`` / ``held_499`` / ``held_503`` for a turn that never
reached the engine) and the model named in the request. Never any prompt content.

Writes are off the hot path: `TurnLog.record` appends a tuple to an in-memory buffer; the sidecar's
tick (every 0.5 s) writes the buffer in one transaction (`flush`) and, at most once a minute, deletes
rows older than the retention (``--turns-retention``, default 24 h). A store that cannot be written
keeps the buffer (up to `MAX_BUFFER` rows, the oldest dropped and counted) and retries on the next
tick; traffic never waits for it.

Ids are ascending integers; readers page with ``after_id`` and ``limit`` and continue from
``next_after_id`` (the last id returned, or ``after_id`` when nothing newer exists).
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from .store import Store

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    session TEXT,
    subtree TEXT,
    prompt_tokens INTEGER,
    cached_tokens INTEGER,
    completion_tokens INTEGER,
    held_s REAL NOT NULL,
    parked_s REAL NOT NULL,
    latency_s REAL,
    outcome TEXT NOT NULL,
    model TEXT
);
CREATE INDEX IF NOT EXISTS turns_ts ON turns(ts);
"""

COLUMNS = (
    "id",
    "ts",
    "session",
    "subtree",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "held_s",
    "parked_s",
    "latency_s",
    "outcome",
    "model",
)
MAX_BUFFER = 100_000
PRUNE_EVERY_S = 60.0
MAX_MODEL_CHARS = 200


class TurnLog:
    """Buffered writer and reader of the ``turns`` table of a `Store`."""

    def __init__(self, store: Store, retention_s: float) -> None:
        self.store = store
        self.retention_s = retention_s
        self._db: sqlite3.Connection = store._db  # one connection, the event loop thread's
        self._db.executescript(SCHEMA)
        self.buffer: list[tuple[Any, ...]] = []
        self.dropped = 0
        self.written = 0
        self._pruned_at = float("-inf")

    def record(
        self,
        ts: float,
        session: str | None,
        subtree: str | None,
        prompt: int | None,
        cached: int | None,
        completion: int | None,
        held_s: float,
        parked_s: float,
        latency_s: float | None,
        outcome: str,
        model: Any,
    ) -> None:
        """Buffer one turn (cheap: the hot path calls it)."""
        if len(self.buffer) >= MAX_BUFFER:
            del self.buffer[0]
            self.dropped += 1
        self.buffer.append(
            (
                ts,
                session,
                subtree,
                prompt,
                cached,
                completion,
                held_s,
                parked_s,
                latency_s,
                outcome,
                model[:MAX_MODEL_CHARS] if isinstance(model, str) else None,
            )
        )

    def flush(self, now: float) -> None:
        """Write the buffer in one transaction and prune expired rows; raises sqlite3.Error (buffer kept)."""
        if self.buffer:
            rows = self.buffer
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    f"INSERT INTO turns({', '.join(COLUMNS[1:])}) VALUES({', '.join('?' * (len(COLUMNS) - 1))})",
                    rows,
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.written += len(rows)
            self.buffer = self.buffer[len(rows) :]
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            self._db.execute("DELETE FROM turns WHERE ts < ?", (now - self.retention_s,))

    def page(self, after_id: int = 0, limit: int = 1000) -> dict[str, Any]:
        """``{"turns": [...], "next_after_id": N}``: turns with ``id > after_id`` in id order."""
        rows = self._db.execute(
            f"SELECT {', '.join(COLUMNS)} FROM turns WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit)
        ).fetchall()
        turns = [dict(zip(COLUMNS, row, strict=True)) for row in rows]
        return {"turns": turns, "next_after_id": turns[-1]["id"] if turns else after_id}


class TurnTracing:
    """Mixin of ControlPlane: the turn trace of its finished (and refused-while-held) turns."""

    turn_log: TurnLog | None
    clock: Any
    store_failed: Any

    def _init_turns(self, store: Store | None, retention_s: float) -> None:
        self.turn_log = TurnLog(store, retention_s) if store is not None else None

    def trace_turn(
        self,
        ticket: Any,
        prompt: int | None,
        cached: int | None,
        completion: int | None,
        latency_s: float | None,
        outcome: str,
    ) -> None:
        if self.turn_log is not None:
            self.turn_log.record(
                self.clock(),
                ticket.session_id,
                ticket.subtree,
                prompt,
                cached,
                completion,
                ticket.held_s,
                ticket.parked_s,
                latency_s,
                outcome,
                ticket.model,
            )

    def flush_turns(self) -> None:
        """Write the buffered turns (the tick, a /turns read, shutdown); a failing store keeps them."""
        if self.turn_log is None:
            return
        try:
            self.turn_log.flush(self.clock())
        except sqlite3.Error as exc:
            self.store_failed(exc)
