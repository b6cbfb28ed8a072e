"""The writer's part for sidecar documents: /state, session and subtree listings, decisions, audit, turns.

Runs inside the writer's transaction (`collectors.store.Store._write`). The row-id caches it
fills belong to the `Store` and are dropped by it when the transaction rolls back.

Incremental entries (decisions, audit) are inserted once per (target, log epoch, remote id):
rows already stored are skipped, so re-reading an id range after a failed write or a
restart stores nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from collectors.scrape import ScrapeOutcome
from collectors.sidecar_docs import state_meta
from db.models import AuditEntry, CompactionDecision, Session, SidecarState, Subtree, Turn

IN_CHUNK = 500
ListingCache = dict[int, dict[str, int]]


def chunks(items: Sequence[Any], size: int = IN_CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def write_sidecar(
    conn: Connection, tid: int, o: ScrapeOutcome, sessions_cache: ListingCache, subtrees_cache: ListingCache
) -> None:
    if o.state is not None:
        meta = state_meta(o.state)
        updated = conn.execute(
            update(SidecarState)
            .where(SidecarState.target_id == tid, SidecarState.ts <= o.ts)
            .values(ts=o.ts, state=o.state, **meta)
        ).rowcount
        if (
            not updated
            and conn.execute(select(SidecarState.target_id).where(SidecarState.target_id == tid)).first()
            is None
        ):
            conn.execute(insert(SidecarState).values(target_id=tid, ts=o.ts, state=o.state, **meta))
    if o.sessions is not None:
        upsert_listing(
            conn, Session, "session_id", sessions_cache, tid, o.sessions, o.ts, full=o.sessions_full
        )
    if o.subtrees is not None:
        upsert_listing(conn, Subtree, "subtree_id", subtrees_cache, tid, o.subtrees, o.ts, full=True)
    entries: tuple[tuple[Any, list[dict[str, Any]], int], ...] = (
        (CompactionDecision, o.decisions, o.decision_epoch),
        (AuditEntry, o.audit, o.audit_epoch),
        (Turn, o.turns, o.turns_epoch),
    )
    for model, rows, epoch in entries:
        if rows:
            insert_entries(conn, model, tid, rows, epoch, o.ts)


def insert_entries(
    conn: Connection, model: Any, tid: int, rows: list[dict[str, Any]], epoch: int, ts: float
) -> None:
    by_id = {r["remote_id"]: r for r in rows}  # a page repeated within one document counts once
    ids = list(by_id)
    have: set[int] = set()
    for chunk in chunks(ids):
        have.update(
            conn.execute(
                select(model.remote_id).where(
                    model.target_id == tid, model.epoch == epoch, model.remote_id.in_(chunk)
                )
            ).scalars()
        )
    fresh = [
        dict(r, target_id=tid, epoch=epoch, ts=r["ts"] if r["ts"] is not None else ts)
        for rid, r in by_id.items()
        if rid not in have
    ]
    if model is AuditEntry:
        fresh = [dict(r, source="sidecar") for r in fresh]
    if (
        fresh
        and epoch > 0
        and conn.execute(
            select(model.id).where(model.target_id == tid, model.epoch == epoch).limit(1)
        ).first()
        is None
    ):
        # The first entry of a restarted log: say so in the audit, where operators look.
        log_name = {AuditEntry: "audit", CompactionDecision: "compaction decisions"}.get(
            model, model.__tablename__
        )
        conn.execute(
            insert(AuditEntry).values(
                source="collector",
                target_id=tid,
                epoch=epoch,
                remote_id=None,
                ts=ts,
                actor="collectors",
                action="sidecar-log-restarted",
                params={"log": log_name, "epoch": epoch},
                outcome=f"the sidecar's {log_name} log restarted at id 1 (state db wiped?): new entries kept as "
                f"epoch {epoch}",
                data={},
            )
        )
    if fresh:
        conn.execute(insert(model), fresh)


def upsert_listing(
    conn: Connection,
    model: Any,
    key: str,
    cache: ListingCache,
    tid: int,
    rows: list[dict[str, Any]],
    ts: float,
    *,
    full: bool,
) -> None:
    """Insert new rows, update known ones; with a `full` listing, rows not in it are no longer present."""
    known = cache.get(tid)
    if known is None:
        known = cache[tid] = {
            r[0]: r[1]
            for r in conn.execute(select(getattr(model, key), model.id).where(model.target_id == tid))
        }
    seen: dict[str, dict[str, Any]] = {}
    for row in rows:
        seen[row[key]] = row
    updates = [
        {"b_id": known[k], "p_last_seen_ts": ts, **{f"p_{c}": v for c, v in row.items() if c != key}}
        for k, row in seen.items()
        if k in known
    ]
    inserts = [
        dict(row, target_id=tid, first_seen_ts=ts, last_seen_ts=ts)
        for k, row in seen.items()
        if k not in known
    ]
    if updates:
        columns = [c[2:] for c in updates[0] if c.startswith("p_")]
        conn.execute(
            update(model)
            .where(model.id == bindparam("b_id"))
            .values({c: bindparam(f"p_{c}") for c in columns}),
            updates,
        )
    if inserts:
        conn.execute(insert(model), inserts)
        for r in conn.execute(select(getattr(model, key), model.id).where(model.target_id == tid)):
            known[r[0]] = r[1]
    if full:
        gone = [row_id for k, row_id in known.items() if k not in seen]
        for chunk in chunks(gone):
            conn.execute(
                update(model).where(model.id.in_(chunk), model.present.is_(True)).values(present=False)
            )
