"""The sidecar's own SQLite state database (WAL): operator overrides, audit log, decisions, sessions.

One connection, used only from the event loop thread (the sidecar is one process,
one worker). Tables:

- ``kv(key, value)``: JSON documents: ``budgeter_config`` (mode, bands: operator overrides)
  and ``compaction`` (the operator deferral).
- ``sessions(id, doc)``: one row per live session (state, context size, manual park, pin, ...),
  the fields ``Budgeter.from_dict`` reads; only changed rows are written.
- ``audit``: append-only log of accepted control actions, ascending integer ids.
- ``decisions``: one row per subtree per compaction request, ascending integer ids.

Both logs are read incrementally with ``after_id``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, doc TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    actor TEXT NOT NULL,
    role TEXT NOT NULL,
    action TEXT NOT NULL,
    params TEXT NOT NULL,
    before TEXT NOT NULL,
    after TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    request_id TEXT NOT NULL,
    subtree_id TEXT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT NOT NULL,
    urgency TEXT NOT NULL,
    regime TEXT NOT NULL,
    request_reason TEXT NOT NULL,
    warm INTEGER NOT NULL,
    recent_hits INTEGER NOT NULL,
    recent_cached_tokens INTEGER NOT NULL,
    token_weighted REAL,
    divergence REAL
);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
"""

AUDIT_COLUMNS = ("id", "ts", "actor", "role", "action", "params", "before", "after")
DECISION_COLUMNS = (
    "id",
    "ts",
    "request_id",
    "subtree_id",
    "decision",
    "reason",
    "urgency",
    "regime",
    "request_reason",
    "warm",
    "recent_hits",
    "recent_cached_tokens",
    "token_weighted",
    "divergence",
)


class Store:
    def __init__(self, path: str | Path, busy_timeout_ms: int = 500) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        # short: a locked store must not stall the event loop (the sidecar fails open and retries)
        self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        self._db.executescript(SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(decisions)")}
        for column in ("token_weighted", "divergence"):  # added after the first release of the schema
            if column not in columns:
                self._db.execute(f"ALTER TABLE decisions ADD COLUMN {column} REAL")

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------------ kv
    def get(self, key: str) -> Any | None:
        row = self._db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: Any, now: float) -> None:
        self._db.execute(
            "INSERT INTO kv(key, value, updated) VALUES(?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated = excluded.updated",
            (key, json.dumps(value, separators=(",", ":")), now),
        )

    def probe(self, now: float) -> None:
        """A real write (raises sqlite3.Error when the store cannot be written: disk full, locked)."""
        self.put("probe", now, now)

    # ------------------------------------------------------------ sessions
    def write_sessions(self, upserts: list[tuple[str, Any]], deletes: list[str]) -> None:
        if not upserts and not deletes:
            return
        self._db.execute("BEGIN")
        try:
            self._db.executemany(
                "INSERT INTO sessions(id, doc) VALUES(?, ?) ON CONFLICT(id) DO UPDATE SET doc = excluded.doc",
                [(sid, json.dumps(doc, separators=(",", ":"))) for sid, doc in upserts],
            )
            self._db.executemany("DELETE FROM sessions WHERE id = ?", [(sid,) for sid in deletes])
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def load_sessions(self) -> list[dict[str, Any]]:
        return [json.loads(doc) for (doc,) in self._db.execute("SELECT doc FROM sessions ORDER BY id")]

    # --------------------------------------------------------------- audit
    def append_audit(
        self, ts: float, actor: str, role: str, action: str, params: Any, before: Any, after: Any
    ) -> int:
        cur = self._db.execute(
            "INSERT INTO audit(ts, actor, role, action, params, before, after) VALUES(?,?,?,?,?,?,?)",
            (ts, actor, role, action, json.dumps(params), json.dumps(before), json.dumps(after)),
        )
        return int(cur.lastrowid or 0)

    def audit(self, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._db.execute(
            f"SELECT {', '.join(AUDIT_COLUMNS)} FROM audit WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, limit),
        ).fetchall()
        out = []
        for row in rows:
            item = dict(zip(AUDIT_COLUMNS, row, strict=True))
            for key in ("params", "before", "after"):
                item[key] = json.loads(item[key])
            out.append(item)
        return out

    # ----------------------------------------------------------- decisions
    def append_decisions(self, rows: list[dict[str, Any]]) -> list[int]:
        ids = []
        self._db.execute("BEGIN")
        try:
            for row in rows:
                cur = self._db.execute(
                    f"INSERT INTO decisions({', '.join(DECISION_COLUMNS[1:])}) "
                    f"VALUES({', '.join('?' * (len(DECISION_COLUMNS) - 1))})",
                    tuple(row[c] for c in DECISION_COLUMNS[1:]),
                )
                ids.append(int(cur.lastrowid or 0))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return ids

    def decisions(self, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._db.execute(
            f"SELECT {', '.join(DECISION_COLUMNS)} FROM decisions WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, limit),
        ).fetchall()
        out = []
        for row in rows:
            item = dict(zip(DECISION_COLUMNS, row, strict=True))
            item["warm"] = bool(item["warm"])
            out.append(item)
        return out

    def decision_counts(self) -> dict[tuple[str, str], int]:
        rows = self._db.execute(
            "SELECT decision, urgency, COUNT(*) FROM decisions GROUP BY decision, urgency"
        )
        return {(d, u): int(n) for d, u, n in rows.fetchall()}
