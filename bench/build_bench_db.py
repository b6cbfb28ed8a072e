"""Build a PrefixOps database of realistic size for benchmarks (the collectors' and the dashboard's).

Default: 8 vLLM engines (engine label "0"), each with the canonical signals the collectors write
every second; the last 24 h as raw 1 s samples and the 7 days before as 1-minute and 10-minute rollups
(plus rollups of the raw day, as the collectors would have built them), the rollup watermarks set so
`db.queries.series_range` reads rollups and raw samples exactly as in production.

    .venv/bin/python bench/build_bench_db.py --out bench/out/bench.db            # reused when present
    .venv/bin/python bench/build_bench_db.py --out bench/out/b.db --sidecars 8 --force

From Python: ``build_bench_db(url, engines=8, ...)`` returns a dict describing what is there.
A database built with the same parameters is reused (the spec is stored in collector_state).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sqlalchemy import insert, select  # noqa: E402

from core import signals as sig  # noqa: E402
from db import make_engine, sqlite_path  # noqa: E402
from db.migrate import upgrade  # noqa: E402
from db.models import CollectorHeartbeat, CollectorState, Rollup1m, Rollup10m, Sample, Series, Target  # noqa: E402
from db.queries import RAW_RETENTION_KEY, ROLLUP10_WATERMARK_KEY, ROLLUP_WATERMARK_KEY  # noqa: E402

ENGINE_SIGNALS = (
    sig.ENGINE_HIT_RATIO,
    sig.KV_USAGE,
    sig.REQUESTS_RUNNING,
    sig.REQUESTS_WAITING,
    sig.PREEMPTIONS_PER_S,
    sig.PROMPT_TOKENS_PER_S,
    sig.GENERATION_TOKENS_PER_S,
    sig.CACHED_TOKENS_PER_S,
    sig.PREFIX_CACHE_QUERIES_PER_S,
    sig.PREFIX_CACHE_HITS_PER_S,
    sig.TTFT_P50,
    sig.TTFT_P90,
    sig.TTFT_P99,
    sig.POOL_TOKENS,
)
TARGET_SIGNALS = (sig.UP, sig.SCRAPE_DURATION_S)
SIDECAR_SIGNALS = (
    sig.TOKEN_WEIGHTED,
    sig.REQUEST_WEIGHTED,
    sig.DIVERGENCE,
    sig.THIN_REUSE,
    sig.POOL_TOKENS,
    sig.DEMAND_TOKENS,
    sig.DEMAND_FRACTION,
    sig.BAND_LOW,
    sig.BAND_HIGH,
    sig.TURNS_PER_S,
    sig.SESSIONS_IN_SYSTEM,
    sig.ADMITTED,
    sig.PARKED,
    sig.WAITING,
    sig.LOW_HALF_CACHED_FRACTION,
)
SPEC_KEY = "bench_spec"


def _value(signal: str, phase: float, rng: random.Random) -> float:
    wave = 0.5 + 0.5 * math.sin(phase)
    noise = rng.random()
    if signal in (sig.ENGINE_HIT_RATIO, sig.TOKEN_WEIGHTED):
        return 0.55 + 0.4 * wave + 0.02 * noise
    if signal == sig.REQUEST_WEIGHTED:
        return 0.9 + 0.05 * noise
    if signal == sig.DIVERGENCE:
        return 0.35 - 0.3 * wave
    if signal in (sig.KV_USAGE, sig.DEMAND_FRACTION):
        return 0.4 + 0.5 * wave
    if signal in (sig.REQUESTS_RUNNING, sig.SESSIONS_IN_SYSTEM, sig.ADMITTED):
        return float(int(5 + 20 * wave + 3 * noise))
    if signal in (sig.REQUESTS_WAITING, sig.PARKED, sig.WAITING):
        return float(int(4 * wave * noise))
    if signal.endswith("_per_s"):
        return 1000.0 * wave + 50 * noise
    if signal.startswith("ttft_"):
        return 0.1 + wave * (1.0 if signal == sig.TTFT_P50 else 3.0)
    if signal in (sig.POOL_TOKENS,):
        return 400_000.0
    if signal == sig.DEMAND_TOKENS:
        return 400_000.0 * (0.4 + 0.5 * wave)
    if signal == sig.BAND_LOW:
        return 0.75
    if signal == sig.BAND_HIGH:
        return 0.95
    if signal == sig.UP:
        return 1.0
    if signal == sig.SCRAPE_DURATION_S:
        return 0.004 + 0.002 * noise
    return noise


def build_bench_db(
    url: str,
    *,
    engines: int = 8,
    sidecars: int = 0,
    raw_hours: float = 24.0,
    rollup_days: float = 7.0,
    end_ts: float | None = None,
    seed: int = 0,
    force: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """Create (or reuse) the benchmark database at `url`; returns its description."""
    spec = {
        "engines": engines,
        "sidecars": sidecars,
        "raw_hours": raw_hours,
        "rollup_days": rollup_days,
        "seed": seed,
        "version": 3,
    }
    path = sqlite_path(url)
    db = make_engine(url)
    upgrade(db)
    with db.connect() as conn:
        stored = conn.execute(select(CollectorState.text).where(CollectorState.key == SPEC_KEY)).scalar()
        if stored and not force:
            info = json.loads(stored)
            if info.get("spec") == spec:
                db.dispose()
                return info
    if path is not None and path.exists() and (stored or force):
        db.dispose()
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        db = make_engine(url)
        upgrade(db)
    started = time.perf_counter()
    rng = random.Random(seed)
    end = math.floor((end_ts if end_ts is not None else time.time()) / 60.0) * 60.0
    raw_start = end - raw_hours * 3600.0
    roll_start = raw_start - rollup_days * 86400.0
    series: list[tuple[int, str]] = []  # (series id, signal)
    with db.begin() as conn:
        for kind, count in (("engine", engines), ("sidecar", sidecars)):
            for i in range(count):
                url_i = f"http://bench-{kind}-{i}:{8000 if kind == 'engine' else 8100}"
                tid = conn.execute(
                    insert(Target)
                    .values(
                        url=url_i,
                        role=kind,
                        kind="vllm" if kind == "engine" else "sidecar",
                        configured_kind="vllm" if kind == "engine" else "sidecar",
                        name=f"{kind}-{i}",
                        labels={"cluster": f"c{i % 2}"},
                        engine_url=f"http://bench-engine-{i}:8000" if kind == "sidecar" else None,
                        configured=True,
                        interval_s=1.0,
                        up=True,
                        last_scrape_ts=end,
                        last_success_ts=end,
                        consecutive_failures=0,
                        created_ts=roll_start,
                    )
                    .returning(Target.id)
                ).scalar_one()
                names = (
                    [(s, "0") for s in ENGINE_SIGNALS]
                    if kind == "engine"
                    else [(s, "") for s in SIDECAR_SIGNALS]
                )
                names += [(s, "") for s in TARGET_SIGNALS]
                for signal, label in names:
                    sid = conn.execute(
                        insert(Series)
                        .values(target_id=tid, engine_label=label, signal=signal)
                        .returning(Series.id)
                    ).scalar_one()
                    series.append((sid, signal))
        conn.execute(
            insert(CollectorHeartbeat).values(
                name="collectors",
                pid=0,
                host="bench",
                started_ts=roll_start,
                last_beat_ts=end,
                targets=engines + sidecars,
                targets_up=engines + sidecars,
                info={},
            )
        )
    raw_rows = roll_rows = 0
    chunk = 200_000
    # Rollups for the whole span (7 days before the raw day, and the raw day itself), 1-minute and
    # the 10-minute tier built from them exactly as the collectors do.
    from collectors.rollups import merge_rollups

    with db.begin() as conn:
        buf: list[dict[str, Any]] = []
        minutes = int((end - roll_start) // 60)
        for sid, signal in series:
            phase0 = rng.random() * 6.28
            rows = []
            for m in range(minutes):
                ts = roll_start + 60.0 * m
                v = _value(signal, phase0 + ts / 3600.0, rng)
                rows.append((sid, ts, v * 0.95, v * 1.05, v, v, 60))
            buf.extend(
                {
                    "series_id": r[0],
                    "ts": r[1],
                    "min": r[2],
                    "max": r[3],
                    "mean": r[4],
                    "last": r[5],
                    "count": r[6],
                }
                for r in rows
            )
            conn.execute(insert(Rollup10m), merge_rollups(rows, 600.0))
            if len(buf) >= chunk:
                conn.execute(insert(Rollup1m), buf)
                roll_rows += len(buf)
                buf = []
        if buf:
            conn.execute(insert(Rollup1m), buf)
            roll_rows += len(buf)
    if not quiet:
        print(f"  rollups: {roll_rows:,} rows in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    seconds = int(raw_hours * 3600)
    raw_conn = None
    if path is not None:
        import sqlite3

        raw_conn = sqlite3.connect(str(path))
        raw_conn.execute("PRAGMA journal_mode=WAL")
        raw_conn.execute("PRAGMA synchronous=OFF")
    for sid, signal in series:
        phase0 = rng.random() * 6.28
        rows = [
            (sid, raw_start + s, _value(signal, phase0 + (raw_start + s) / 3600.0, rng))
            for s in range(seconds)
        ]
        if raw_conn is not None:
            raw_conn.executemany("INSERT INTO samples(series_id, ts, value) VALUES (?, ?, ?)", rows)
            raw_conn.commit()
        else:
            with db.begin() as conn:
                for i in range(0, len(rows), chunk):
                    conn.execute(
                        insert(Sample),
                        [{"series_id": a, "ts": b, "value": c} for a, b, c in rows[i : i + chunk]],
                    )
        raw_rows += len(rows)
    if raw_conn is not None:
        raw_conn.close()
    info = {
        "spec": spec,
        "url": url,
        "end_ts": end,
        "raw_start_ts": raw_start,
        "rollup_start_ts": roll_start,
        "series": len(series),
        "raw_rows": raw_rows,
        "rollup_rows": roll_rows,
        "build_s": round(time.perf_counter() - started, 1),
    }
    with db.begin() as conn:
        for key, value, text in (
            (ROLLUP_WATERMARK_KEY, end, None),
            (ROLLUP10_WATERMARK_KEY, end, None),
            (RAW_RETENTION_KEY, raw_hours * 3600.0, None),
            (SPEC_KEY, None, json.dumps(info)),
        ):
            conn.execute(insert(CollectorState).values(key=key, value=value, text=text))
    db.dispose()
    if not quiet:
        print(f"  raw: {raw_rows:,} rows; built in {info['build_s']} s", file=sys.stderr)
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "bench" / "out" / "bench.db"), help="SQLite file (or --url)")
    p.add_argument("--url", help="SQLAlchemy URL instead of --out (e.g. PostgreSQL)")
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--sidecars", type=int, default=0)
    p.add_argument("--raw-hours", type=float, default=24.0)
    p.add_argument("--rollup-days", type=float, default=7.0)
    p.add_argument("--force", action="store_true", help="rebuild even when a matching database exists")
    args = p.parse_args(argv)
    url = args.url or f"sqlite:///{Path(args.out).resolve()}"
    if not args.url:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    info = build_bench_db(
        url,
        engines=args.engines,
        sidecars=args.sidecars,
        raw_hours=args.raw_hours,
        rollup_days=args.rollup_days,
        force=args.force,
    )
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
