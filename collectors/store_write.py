"""The store's write path: scrape outcomes and derived signals into samples and target rows.

A mixin of `collectors.store.Store`. Writes are batched: every `write` is one transaction with
one multi-row insert per table; a sidecar's documents go through `collectors.store_sidecar`
inside the same transaction.

Row-id caches (series, sessions, subtrees) are transactional: any failed transaction drops
them all, so an id handed out inside a rolled-back transaction (which the database then
reuses for another row) is never used again. A failed write never raises: `write` returns
what was committed and what failed, with a one-line cause, and the caller retries or
re-reads (sidecar cursors only advance past committed entries).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, insert, select, update
from sqlalchemy.exc import OperationalError

from collectors.failures import describe_failure
from collectors.scrape import ScrapeOutcome
from collectors.store_sidecar import chunks as _chunks
from collectors.store_sidecar import write_sidecar
from core import signals as sig
from db.models import Sample, Series, Target


@dataclass
class WriteResult:
    committed: list[ScrapeOutcome] = field(default_factory=list)
    failed: list[ScrapeOutcome] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)  # one line each


def target_specific(exc: BaseException) -> bool:
    """False for failures of the database as a whole (locked, full, unreachable): retrying each
    target alone would only wait for the same lock once per target."""
    return not isinstance(exc, OperationalError)


class ScrapeWrites:
    engine: Engine
    target_ids: dict[str, int]
    _series: dict[tuple[int, str, str], int]
    _sessions: dict[int, dict[str, int]]
    _subtrees: dict[int, dict[str, int]]

    def _forget(self) -> None:
        """Drop every row-id cache: after a rollback they may name rows that no longer exist."""
        self._series.clear()
        self._sessions.clear()
        self._subtrees.clear()

    def _series_ids(self, conn: Connection, keys: set[tuple[int, str, str]]) -> None:
        missing = [k for k in keys if k not in self._series]
        if not missing:
            return
        target_ids = sorted({k[0] for k in missing})

        def load() -> None:
            for chunk in _chunks(target_ids):
                for row in conn.execute(
                    select(Series.id, Series.target_id, Series.engine_label, Series.signal).where(
                        Series.target_id.in_(chunk)
                    )
                ):
                    self._series[(row.target_id, row.engine_label, row.signal)] = row.id

        load()
        new = [k for k in missing if k not in self._series]
        if new:
            conn.execute(
                insert(Series), [{"target_id": t, "engine_label": label, "signal": s} for t, label, s in new]
            )
            load()

    def write(self, outcomes: Sequence[ScrapeOutcome]) -> WriteResult:
        """Store a batch of scrape outcomes in one transaction.

        When that fails on the data of some target (not on the database as a whole: locked, full,
        unreachable), each target's outcomes are written again in a transaction of their own, so
        one bad target does not cost the others their data. Never raises for a failed write: the
        result lists what was committed and what failed, with a one-line cause.
        """
        result = WriteResult()
        outcomes = [o for o in outcomes if o.url in self.target_ids]
        if not outcomes:
            return result
        try:
            self._transaction(outcomes)
            result.committed.extend(outcomes)
            return result
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none may stop the writer
            if len({o.url for o in outcomes}) == 1 or not target_specific(exc):
                result.failed.extend(outcomes)
                result.causes.append(describe_failure(exc))
                return result
        by_url: dict[str, list[ScrapeOutcome]] = {}
        for o in outcomes:
            by_url.setdefault(o.url, []).append(o)
        for url, group in by_url.items():
            try:
                self._transaction(group)
                result.committed.extend(group)
            except Exception as exc:  # noqa: BLE001
                result.failed.extend(group)
                result.causes.append(f"{url}: {describe_failure(exc)}")
        return result

    def write_derived(self, rows: Sequence[tuple[str, str, str, float, float]]) -> None:
        """Store signals the collectors compute themselves (the collapse risk), one transaction:
        ``(target URL, engine label, signal, ts, value)``. Raises on failure (the caller logs it)."""
        samples = [
            ((self.target_ids[url], label, name), ts, float(value))
            for url, label, name, ts, value in rows
            if url in self.target_ids and math.isfinite(value)
        ]
        if not samples:
            return
        try:
            with self.engine.begin() as conn:
                self._series_ids(conn, {k for k, _, _ in samples})
                dedup = {(self._series[k], ts): value for k, ts, value in samples}
                conn.execute(
                    insert(Sample),
                    [{"series_id": sid, "ts": ts, "value": v} for (sid, ts), v in dedup.items()],
                )
        except BaseException:
            self._forget()
            raise

    def _transaction(self, outcomes: Sequence[ScrapeOutcome]) -> None:
        try:
            with self.engine.begin() as conn:
                self._write(conn, outcomes)
        except BaseException:
            self._forget()
            raise

    def _write(self, conn: Connection, outcomes: Sequence[ScrapeOutcome]) -> None:
        sample_rows: list[tuple[tuple[int, str, str], float, float]] = []
        target_updates: list[dict[str, Any]] = []
        for o in outcomes:
            tid = self.target_ids[o.url]
            samples = o.samples if o.ok else [("", sig.UP, 0.0), ("", sig.SCRAPE_DURATION_S, o.duration_s)]
            for label, name, value in samples:
                if value is None or not math.isfinite(value):
                    continue
                sample_rows.append(((tid, label, name), o.ts, float(value)))
            target_updates.append({"b_id": tid, "p_up": o.ok, "p_ts": o.ts, "p_dur": o.duration_s})
        self._series_ids(conn, {k for k, _, _ in sample_rows})
        if sample_rows:
            # One series can be sampled twice at the same instant only by a clock step; keep the last.
            dedup = {(self._series[k], ts): value for k, ts, value in sample_rows}
            have: set[tuple[int, float]] = set()
            if any(o.retried for o in outcomes):  # a retried batch may have landed in part before
                for chunk in _chunks(sorted({sid for sid, _ in dedup})):
                    have.update(
                        (r[0], r[1])
                        for r in conn.execute(
                            select(Sample.series_id, Sample.ts).where(
                                Sample.series_id.in_(chunk), Sample.ts.in_({ts for _, ts in dedup})
                            )
                        )
                    )
            rows = [
                {"series_id": sid, "ts": ts, "value": v}
                for (sid, ts), v in dedup.items()
                if (sid, ts) not in have
            ]
            if rows:
                conn.execute(insert(Sample), rows)
        # A retried (older) outcome never overwrites what a newer one already recorded.
        newer_or_first = (Target.id == bindparam("b_id")) & (
            Target.last_scrape_ts.is_(None) | (Target.last_scrape_ts <= bindparam("p_ts"))
        )
        conn.execute(
            update(Target)
            .where(newer_or_first)
            .values(
                up=bindparam("p_up"), last_scrape_ts=bindparam("p_ts"), scrape_duration_s=bindparam("p_dur")
            ),
            target_updates,
        )
        ok_rows = [
            {
                "b_id": self.target_ids[o.url],
                "p_ts": o.ts,
                "p_kind": o.kind or "unknown",
                "p_pst": o.process_start_ts,
            }
            for o in outcomes
            if o.ok
        ]
        if ok_rows:
            conn.execute(
                update(Target)
                .where(newer_or_first)
                .values(
                    last_success_ts=bindparam("p_ts"),
                    kind=bindparam("p_kind"),
                    process_start_ts=bindparam("p_pst"),
                    consecutive_failures=0,
                    last_error=None,
                ),
                ok_rows,
            )
        bad_rows = [
            {"b_id": self.target_ids[o.url], "p_ts": o.ts, "p_err": (o.error or "unknown error")[:2000]}
            for o in outcomes
            if not o.ok
        ]
        if bad_rows:
            conn.execute(
                update(Target)
                .where(newer_or_first)
                .values(
                    last_error=bindparam("p_err"),
                    last_error_ts=bindparam("p_ts"),
                    consecutive_failures=Target.consecutive_failures + 1,
                ),
                bad_rows,
            )
        for o in outcomes:
            if o.ok and o.role == "sidecar":
                write_sidecar(conn, self.target_ids[o.url], o, self._sessions, self._subtrees)
