"""Rollups and retention of the collectors' store (a mixin of `collectors.store.Store`).

Complete minutes of raw samples roll into ``rollups_1m`` and complete ten-minute periods of
those into ``rollups_10m``, each from a watermark kept in ``collector_state``, in short
transactions so catching up after downtime never holds the writer for long. Retention never
drops raw samples that are not rolled up yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from itertools import groupby
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select, update

from collectors import turn_trace
from collectors.store_sidecar import chunks as _chunks
from db.models import CollectorState, Notification, Rollup1m, Rollup10m, Sample, Series, Session, Subtree
from db.queries import RAW_RETENTION_KEY, ROLLUP10_WATERMARK_KEY, ROLLUP_WATERMARK_KEY

ROLLUP_LAG_S = 15.0  # minutes end this long before they are rolled up (late samples still land)
ROLLUP_MAX_MINUTES = 120  # per call, so catching up after downtime is done in short transactions


class Rollups:
    engine: Engine
    clock: Callable[[], float]

    def _state(self, conn: Connection, key: str) -> float | None:
        return conn.execute(select(CollectorState.value).where(CollectorState.key == key)).scalar()

    def _set_state(self, conn: Connection, key: str, value: float) -> None:
        if not conn.execute(
            update(CollectorState).where(CollectorState.key == key).values(value=value)
        ).rowcount:
            conn.execute(insert(CollectorState).values(key=key, value=value))

    def all_series_ids(self, conn: Connection) -> list[int]:
        return list(conn.execute(select(Series.id).order_by(Series.id)).scalars())

    @staticmethod
    def _first_bucket(
        conn: Connection, table: Any, ids: Sequence[int], bucket_s: float, *, default: float
    ) -> float:
        """Start of the bucket holding the oldest row of `table` (samples or a rollup tier), or `default`."""
        first = None
        for chunk in _chunks(ids):
            m = conn.execute(select(func.min(table.ts)).where(table.series_id.in_(chunk))).scalar()
            if m is not None:
                first = m if first is None else min(first, m)
        return math.floor(first / bucket_s) * bucket_s if first is not None else default

    def rollup(self, now: float | None = None, *, lag_s: float = ROLLUP_LAG_S) -> int:
        """Roll complete minutes of raw samples into rollups_1m, from the watermark on. Returns rows written."""
        now = self.clock() if now is None else now
        end = math.floor((now - lag_s) / 60.0) * 60.0
        written = 0
        with self.engine.begin() as conn:
            start = self._state(conn, ROLLUP_WATERMARK_KEY)
            ids = self.all_series_ids(conn)
            if start is None:
                start = self._first_bucket(conn, Sample, ids, 60.0, default=end)
            stop = min(end, start + ROLLUP_MAX_MINUTES * 60.0)
            if stop <= start:
                if self._state(conn, ROLLUP_WATERMARK_KEY) is None:
                    self._set_state(conn, ROLLUP_WATERMARK_KEY, start)
                return 0
            for chunk in _chunks(ids):
                rows = conn.execute(
                    select(Sample.series_id, Sample.ts, Sample.value)
                    .where(Sample.series_id.in_(chunk), Sample.ts >= start, Sample.ts < stop)
                    .order_by(Sample.series_id, Sample.ts)
                ).all()
                out = rollup_rows(rows)
                if out:
                    # A restart may re-roll a minute it already wrote: replace it.
                    keys = {(r["series_id"], r["ts"]) for r in out}
                    minutes = sorted({k[1] for k in keys})
                    conn.execute(
                        delete(Rollup1m).where(
                            Rollup1m.series_id.in_(chunk),
                            Rollup1m.ts >= minutes[0],
                            Rollup1m.ts <= minutes[-1],
                        )
                    )
                    conn.execute(insert(Rollup1m), out)
                    written += len(out)
            self._set_state(conn, ROLLUP_WATERMARK_KEY, stop)
        if stop < end:
            return written + self.rollup(now, lag_s=lag_s)
        return written + self.rollup_10m()

    def rollup_10m(self) -> int:
        """Roll complete 10-minute periods of 1-minute rollups (up to their watermark) into rollups_10m."""
        written = 0
        with self.engine.begin() as conn:
            minute_mark = self._state(conn, ROLLUP_WATERMARK_KEY)
            if minute_mark is None:
                return 0
            end = math.floor(minute_mark / 600.0) * 600.0
            start = self._state(conn, ROLLUP10_WATERMARK_KEY)
            ids = self.all_series_ids(conn)
            if start is None:
                start = self._first_bucket(conn, Rollup1m, ids, 600.0, default=end)
            stop = min(end, start + 7 * 86400.0)  # a week per transaction when backfilling
            if stop > start:
                for chunk in _chunks(ids):
                    rows = conn.execute(
                        select(
                            Rollup1m.series_id,
                            Rollup1m.ts,
                            Rollup1m.min,
                            Rollup1m.max,
                            Rollup1m.mean,
                            Rollup1m.last,
                            Rollup1m.count,
                        )
                        .where(Rollup1m.series_id.in_(chunk), Rollup1m.ts >= start, Rollup1m.ts < stop)
                        .order_by(Rollup1m.series_id, Rollup1m.ts)
                    ).all()
                    out = merge_rollups(rows, 600.0)
                    if out:
                        conn.execute(
                            delete(Rollup10m).where(
                                Rollup10m.series_id.in_(chunk), Rollup10m.ts >= start, Rollup10m.ts < stop
                            )
                        )
                        conn.execute(insert(Rollup10m), out)
                        written += len(out)
            self._set_state(conn, ROLLUP10_WATERMARK_KEY, max(start, stop))
        if stop < end:
            written += self.rollup_10m()
        return written

    def retention(
        self,
        raw_retention_s: float,
        rollup_retention_s: float,
        now: float | None = None,
        *,
        keep_alerts_s: float | None = None,
    ) -> tuple[int, int]:
        """Delete raw samples older than the raw window (only once rolled up) and old rollups."""
        now = self.clock() if now is None else now
        raw_removed = roll_removed = 0
        with self.engine.begin() as conn:
            watermark = self._state(conn, ROLLUP_WATERMARK_KEY)
            # Never drop what is not rolled up yet.
            raw_cutoff = min(now - raw_retention_s, watermark) if watermark is not None else -math.inf
            roll_cutoff = now - rollup_retention_s
            for chunk in _chunks(self.all_series_ids(conn)):
                if raw_cutoff > -math.inf:
                    raw_removed += (
                        conn.execute(
                            delete(Sample).where(Sample.series_id.in_(chunk), Sample.ts < raw_cutoff)
                        ).rowcount
                        or 0
                    )
                roll_removed += (
                    conn.execute(
                        delete(Rollup1m).where(Rollup1m.series_id.in_(chunk), Rollup1m.ts < roll_cutoff)
                    ).rowcount
                    or 0
                )
                conn.execute(
                    delete(Rollup10m).where(Rollup10m.series_id.in_(chunk), Rollup10m.ts < roll_cutoff)
                )
            self._set_state(conn, RAW_RETENTION_KEY, raw_retention_s)
            turn_trace.prune(conn, now - raw_retention_s)  # the turn trace goes with the raw tier
            keep = rollup_retention_s if keep_alerts_s is None else keep_alerts_s
            conn.execute(delete(Notification).where(Notification.created_ts < now - keep))
            conn.execute(delete(Session).where(Session.present.is_(False), Session.last_seen_ts < now - keep))
            conn.execute(delete(Subtree).where(Subtree.present.is_(False), Subtree.last_seen_ts < now - keep))
        return raw_removed, roll_removed


def merge_rollups(rows: Iterable[Any], period_s: float) -> list[dict[str, Any]]:
    """(series_id, ts, min, max, mean, last, count) rollups ordered by series and time -> one per period."""
    out: list[dict[str, Any]] = []
    for (series_id, period), group in groupby(
        rows, key=lambda r: (r[0], math.floor(r[1] / period_s) * period_s)
    ):
        items = list(group)
        count = sum(r[6] for r in items)
        mean = sum(r[4] * r[6] for r in items) / count if count else items[-1][4]
        out.append(
            {
                "series_id": series_id,
                "ts": period,
                "min": min(r[2] for r in items),
                "max": max(r[3] for r in items),
                "mean": mean,
                "last": items[-1][5],
                "count": count,
            }
        )
    return out


def rollup_rows(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """(series_id, ts, value) rows ordered by series and time -> one rollup dict per series-minute."""
    out: list[dict[str, Any]] = []
    current: tuple[int, float] | None = None
    acc: dict[str, Any] = {}
    for series_id, ts, value in rows:
        minute = math.floor(ts / 60.0) * 60.0
        key = (series_id, minute)
        if key != current:
            if current is not None:
                acc["mean"] = acc.pop("sum") / acc["count"]
                out.append(acc)
            current = key
            acc = {
                "series_id": series_id,
                "ts": minute,
                "min": value,
                "max": value,
                "sum": 0.0,
                "last": value,
                "count": 0,
            }
        acc["min"] = min(acc["min"], value)
        acc["max"] = max(acc["max"], value)
        acc["sum"] += value
        acc["last"] = value
        acc["count"] += 1
    if current is not None:
        acc["mean"] = acc.pop("sum") / acc["count"]
        out.append(acc)
    return out
