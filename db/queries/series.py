"""Points of series over a time range, at a resolution that keeps every chart under `max_points`.

Resolution: `series_range` picks raw samples or 1-minute rollups from the requested range so
no series has more than `max_points` points (default 2000), and buckets further when needed.
Rolled-up minutes come from ``rollups_1m``; the minutes after the rollup watermark (the
newest, not yet rolled up) come from raw samples, so a live chart has no hole at its end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

from sqlalchemy import BigInteger, cast, func, select
from sqlalchemy.sql import ColumnElement

from db.models import CollectorState, Rollup1m, Rollup10m, Sample, Series
from db.queries._common import Conn, engine_in, engine_out, rows, run

DEFAULT_MAX_POINTS = 2000
RAW_BUCKET_LIMIT_S = 15.0  # coarser buckets than this read the 1-minute rollups instead of raw samples
ROLLUP_1M_LIMIT_S = 120.0  # coarser buckets than this read the 10-minute rollups
ROLLUP_WATERMARK_KEY = "rollup_watermark_ts"  # collector_state key: minutes before it are rolled up
ROLLUP10_WATERMARK_KEY = "rollup10_watermark_ts"  # 10-minute periods before it are in rollups_10m
RAW_RETENTION_KEY = "raw_retention_s"


def _append_points(found: list[Any], out: dict[int, dict[str, Any]]) -> None:
    """(series_id, bucket, mean, min, max) rows, ordered, appended to each series after its last point."""
    for series_id, group in groupby(found, key=itemgetter(0)):
        entry = out[series_id]
        last = entry["ts"][-1] if entry["ts"] else None
        items = [r for r in group if last is None or float(r[1]) > last]
        entry["ts"].extend(float(r[1]) for r in items)
        entry["value"].extend(r[2] for r in items)
        entry["min"].extend(r[3] for r in items)
        entry["max"].extend(r[4] for r in items)


def _bucket_expr(conn: Conn, column: Any, bucket_s: float) -> ColumnElement[Any]:
    if conn.dialect.name == "sqlite":
        # CAST truncates toward zero in SQLite; timestamps are positive.
        return cast(column / bucket_s, BigInteger) * bucket_s
    return func.floor(column / bucket_s) * bucket_s


def choose_resolution(
    start_ts: float, end_ts: float, *, max_points: int = DEFAULT_MAX_POINTS, raw_interval_s: float = 1.0
) -> tuple[str, float]:
    """("raw" | "1m" | "10m", bucket seconds) so that (end - start) / bucket <= max_points.

    Raw samples (bucket 0 = unbucketed) while each point would cover at most 1 s; raw samples
    averaged into buckets up to 15 s; then the 1-minute rollups in buckets of whole minutes up to
    2 minutes; beyond that the 10-minute rollups in buckets of whole 10 minutes. With the default
    2,000 points: 1 h reads raw samples in 2 s buckets, 24 h the 1-minute rollups minute by minute,
    7 days the 10-minute rollups (1,008 points), 30 days 30-minute buckets of them.
    """
    span = max(0.0, end_ts - start_ts)
    needed = span / max_points if max_points > 0 else span
    if needed <= raw_interval_s:
        return "raw", 0.0
    if needed <= RAW_BUCKET_LIMIT_S:
        return "raw", float(math.ceil(needed))
    if needed <= ROLLUP_1M_LIMIT_S:
        return "1m", 60.0 * math.ceil(needed / 60.0)
    return "10m", 600.0 * math.ceil(needed / 600.0)


def rollup_watermark(conn: Conn, key: str = ROLLUP_WATERMARK_KEY) -> float | None:
    rows = run(conn, select(CollectorState.value).where(CollectorState.key == key))
    return rows[0]["value"] if rows else None


def _read_rollups(
    conn: Conn,
    model: Any,
    ids: list[int],
    start: float,
    end: float,
    bucket: float,
    out: dict[int, dict[str, Any]],
) -> None:
    if end <= start:
        return
    native = 600.0 if model is Rollup10m else 60.0
    if bucket <= native:
        stmt = (
            select(
                model.series_id,
                model.ts.label("bucket"),
                model.mean.label("v"),
                model.min.label("mn"),
                model.max.label("mx"),
            )
            .where(model.series_id.in_(ids), model.ts >= start, model.ts < end)
            .order_by(model.series_id, model.ts)
        )
    else:
        b = _bucket_expr(conn, model.ts, bucket)
        stmt = (
            select(
                model.series_id,
                b.label("bucket"),
                (func.sum(model.mean * model.count) / func.sum(model.count)).label("v"),
                func.min(model.min).label("mn"),
                func.max(model.max).label("mx"),
            )
            .where(model.series_id.in_(ids), model.ts >= start, model.ts < end)
            .group_by(model.series_id, b)
            .order_by(model.series_id, b)
        )
    _append_points(rows(conn, stmt), out)


def series_range(
    conn: Conn,
    *,
    signals: Sequence[str] | str,
    start_ts: float,
    end_ts: float,
    target_ids: Sequence[int] | None = None,
    engine: str | None | bool = False,
    max_points: int = DEFAULT_MAX_POINTS,
    resolution: str | None = None,
) -> dict[str, Any]:
    """Points of the matching series in [start_ts, end_ts].

    `engine`: False = every engine label; None = the target-level series (label ""); a string =
    that label. Returns ``{"resolution": "raw"|"1m"|"10m", "bucket_s": float, "series": [{"series_id",
    "target_id", "engine", "signal", "ts": [...], "value": [...], "min": [...], "max": [...]}]}``,
    ``value`` being the mean over each bucket (the raw value when unbucketed); ``min``/``max`` are
    present when bucketed. Points are ascending in time; missing intervals are simply absent
    (draw gaps with ``connectgaps=False`` on a gap larger than a few buckets). The newest part of
    a rollup view (after the rollup watermarks) is read from the next finer tier, down to raw.
    """
    if isinstance(signals, str):
        signals = [signals]
    chosen, bucket = choose_resolution(start_ts, end_ts, max_points=max_points)
    if resolution is not None and resolution != chosen:
        chosen = resolution
        bucket = {
            "raw": bucket if bucket < 60 else 15.0,
            "1m": max(60.0, 60.0 * math.ceil(bucket / 60.0)),
            "10m": max(600.0, 600.0 * math.ceil(bucket / 600.0)),
        }[resolution]
    stmt = select(Series.id, Series.target_id, Series.engine_label, Series.signal).where(
        Series.signal.in_(list(signals))
    )
    if target_ids is not None:
        stmt = stmt.where(Series.target_id.in_(list(target_ids)))
    if engine is not False:
        stmt = stmt.where(Series.engine_label == engine_in(engine))  # type: ignore[arg-type]
    meta = {r["id"]: r for r in run(conn, stmt)}
    out: dict[int, dict[str, Any]] = {
        sid: {
            "series_id": sid,
            "target_id": r["target_id"],
            "engine": engine_out(r["engine_label"]),
            "signal": r["signal"],
            "ts": [],
            "value": [],
            **({"min": [], "max": []} if bucket else {}),
        }
        for sid, r in meta.items()
    }
    if not meta:
        return {"resolution": chosen, "bucket_s": bucket, "series": []}
    ids = list(meta)
    cursor = start_ts
    if chosen == "10m":
        mark10 = rollup_watermark(conn, ROLLUP10_WATERMARK_KEY)
        if mark10 is not None:
            _read_rollups(conn, Rollup10m, ids, cursor, min(end_ts, mark10), bucket, out)
            cursor = max(cursor, min(end_ts, mark10))
    if chosen in ("1m", "10m"):
        mark1 = rollup_watermark(conn)
        if mark1 is not None:
            _read_rollups(conn, Rollup1m, ids, cursor, min(end_ts, mark1), bucket, out)
            cursor = max(cursor, min(end_ts, mark1))
    if cursor <= end_ts:
        if bucket:
            b = _bucket_expr(conn, Sample.ts, bucket)
            sstmt = (
                select(
                    Sample.series_id,
                    b.label("bucket"),
                    func.avg(Sample.value).label("v"),
                    func.min(Sample.value).label("mn"),
                    func.max(Sample.value).label("mx"),
                )
                .where(Sample.series_id.in_(ids), Sample.ts >= cursor, Sample.ts <= end_ts)
                .group_by(Sample.series_id, b)
                .order_by(Sample.series_id, b)
            )
            _append_points(rows(conn, sstmt), out)
        else:
            sstmt = (
                select(Sample.series_id, Sample.ts, Sample.value)
                .where(Sample.series_id.in_(ids), Sample.ts >= cursor, Sample.ts <= end_ts)
                .order_by(Sample.series_id, Sample.ts)
            )
            for series_id, group in groupby(rows(conn, sstmt), key=itemgetter(0)):
                entry = out[series_id]
                items = list(group)
                entry["ts"].extend(r[1] for r in items)
                entry["value"].extend(r[2] for r in items)
    series = sorted(out.values(), key=lambda e: (e["target_id"], e["engine"] or "", e["signal"]))
    return {"resolution": chosen, "bucket_s": bucket, "series": series}
