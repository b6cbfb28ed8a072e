"""Collectors benchmark: parse+store per scrape, engines sustained per core at 1 s, query time of engine views.

    .venv/bin/python bench/bench_collectors.py                 # everything (about 3-4 minutes)
    .venv/bin/python bench/bench_collectors.py --quick         # smaller fleet run and DB (about 1 minute)
    .venv/bin/python bench/bench_collectors.py --skip-fleet    # no live fleet run
    .venv/bin/python bench/bench_collectors.py --skip-queries  # parse and fleet only (no 300 MB database)

1. **parse+store per scrape** of the vLLM 0.33 fixture (554 lines, 82 families): parse (filtered, what the
   collector does; CPU time of the thread) vs the whole page through prometheus_client's parser (baseline) and vs the filtered
   page through prometheus_client's parser instead of `core.engine_metrics.text` (the reader baseline,
   what the collector did before that reader), then parse + store in
   a SQLite WAL database, one transaction per scrape, and batched 200 scrapes per transaction (what the
   writer thread does under load). Medians of --runs repetitions.
2. **engines sustained on one core at a 1 s interval**: a real `python -m collectors` process pinned to
   CPU 0 scrapes N fake engines (one asyncio server process pinned to the other CPU, serving the vLLM
   0.33 fixture with advancing counters) for --fleet-seconds; scrapes/s achieved vs N and the
   collector's CPU use (from /proc) give the capacity: engines per core = achieved scrapes/s / CPU share.
   Each size runs twice in the same run: as shipped, and the baseline whose collector reads every page
   with prometheus_client's parser (``--no-baseline`` skips it); the ratio of the two is the figure.
3. **query time behind a 24 h and a 7-day engine view** over bench/build_bench_db.py's database
   (24 h raw 1 s samples + 7 days of rollups, 8 engines): `db.queries.series_range` for the six charted
   signals of one engine, the hit ratio of all 8 engines, and `latest_signals`. Median of --runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FIXTURE = REPO / "tests" / "fixtures" / "engine-metrics" / "vllm-0.33.0-statlogger.prom"
PY = sys.executable
ENGINE_VIEW = [
    "engine_hit_ratio",
    "kv_usage",
    "requests_running",
    "requests_waiting",
    "prompt_tokens_per_s",
    "ttft_p90",
]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000.0


def _whole_page_parser(page: str) -> list:
    from core.engine_metrics import text

    raise text._Unread("benchmark baseline: prometheus_client's parser for every page")


@contextlib.contextmanager
def prometheus_client_reader() -> Iterator[None]:
    """The reader baseline in this process: `read_families` hands every page to prometheus_client."""
    from core.engine_metrics import text

    fast = text._fast
    text._fast = _whole_page_parser
    try:
        yield
    finally:
        text._fast = fast


# `python -m collectors` with the reader baseline (the same process otherwise)
BASELINE_COLLECTOR = (
    "import runpy, sys; from bench.bench_collectors import _whole_page_parser; "
    "import core.engine_metrics.text as text; text._fast = _whole_page_parser; sys.argv[0] = 'collectors'; "
    "runpy.run_module('collectors', run_name='__main__', alter_sys=True)"
)


# ------------------------------------------------------------------ 1. parse + store


def bench_parse_store(runs: int, scrapes: int) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    from collectors.config import CollectorConfig, EngineTarget
    from collectors.scrape import EngineScraper
    from collectors.store import Store
    from core.engine_metrics import parse_engine_metrics
    from db import make_engine
    from db.migrate import upgrade

    text = FIXTURE.read_text()
    full, filtered, reader_baseline = [], [], []
    cpu = time.thread_time  # CPU time: under `nice -n 19` on a busy machine wall time is mostly waiting
    for _ in range(runs * 20):
        t0 = cpu()
        list(text_string_to_metric_families(text))
        t1 = cpu()
        parse_engine_metrics(text)
        t2 = cpu()
        with prometheus_client_reader():
            t3 = cpu()
            parse_engine_metrics(text)
            t4 = cpu()
        full.append(t1 - t0)
        filtered.append(t2 - t1)
        reader_baseline.append(t4 - t3)
    single, batch_parse, batch_write = [], [], []
    for _ in range(runs):
        tmp = Path(tempfile.mkdtemp(prefix="bench-coll-"))
        db = make_engine(f"sqlite:///{tmp / 'b.db'}")
        upgrade(db)
        urls = [f"http://e{i}:8000" for i in range(200)]
        store = Store(db)
        store.sync_targets(CollectorConfig(engines=tuple(EngineTarget(u) for u in urls)))
        scrapers = [
            EngineScraper(EngineTarget(u), interval_s=1, timeout_s=1, max_page_bytes=10**7) for u in urls
        ]
        ts = 1_800_000_000.0
        store.write([s.ingest_text(text, ts) for s in scrapers])  # series exist, like a running collector
        for r in range(max(1, scrapes // 100)):
            # One scrape per transaction (a lone target) ...
            times = []
            for i in range(20):
                ts += 1.0
                t0 = time.perf_counter()
                store.write(
                    [scrapers[0].ingest_text(text.replace("25477.0", f"{25477 + 1000 * (r * 20 + i)}.0"), ts)]
                )
                times.append(time.perf_counter() - t0)
            single.append(statistics.median(times))
            # ... and 200 targets' scrapes per transaction (the writer under load).
            ts += 1.0
            t0 = time.perf_counter()
            outcomes = [s.ingest_text(text, ts) for s in scrapers]
            t1 = time.perf_counter()
            store.write(outcomes)
            t2 = time.perf_counter()
            batch_parse.append((t1 - t0) / len(scrapers))
            batch_write.append((t2 - t1) / len(scrapers))
        db.dispose()
    batched = [p + w for p, w in zip(batch_parse, batch_write, strict=True)]
    return {
        "parse_full_page_ms": median_ms(full),
        "parse_filtered_ms": median_ms(filtered),
        "parse_filtered_prometheus_client_ms": median_ms(reader_baseline),
        "parse_store_single_ms": median_ms(single),
        "parse_store_batched_ms": median_ms(batched),
        "store_batched_ms": median_ms(batch_write),
    }


# ------------------------------------------------------------------ 2. fleet


FLEET_SERVER = r"""
import asyncio, os, sys
text = open(sys.argv[1]).read()
port = int(sys.argv[2])
counter = [0]
def page():
    counter[0] += 1
    n = counter[0]
    body = text.replace("25477.0", f"{25477 + 1000 * n}.0").replace("10576.0", f"{10576 + 800 * n}.0").encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            writer.write(page())
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=2048)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_fleet(n: int, seconds: float, warmup: float = 8.0, baseline: bool = False) -> dict:
    from sqlalchemy import func, select

    from db import make_engine
    from db.models import Sample, Series
    from tests.support import free_port, wait_for

    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    port = free_port()
    server_py = tmp / "fleet_server.py"
    server_py.write_text(FLEET_SERVER)
    cpus = sorted(os.sched_getaffinity(0))
    collector_cpu = {cpus[0]}
    server_cpus = set(cpus[1:]) or {cpus[0]}
    server = subprocess.Popen(
        [PY, str(server_py), str(FIXTURE), str(port)],
        stdout=subprocess.PIPE,
        preexec_fn=lambda: os.sched_setaffinity(0, server_cpus),
    )
    assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
    config = tmp / "fleet.toml"
    config.write_text(
        "[collector]\ninterval_s = 1.0\ntimeout_s = 2.0\n\n"
        + "".join(f'[[engines]]\nurl = "http://127.0.0.1:{port}/e{i}"\nkind = "vllm"\n\n' for i in range(n))
    )
    db_url = f"sqlite:///{tmp / 'fleet.db'}"
    log = open(tmp / "collector.log", "w")  # noqa: SIM115 - closed in the finally below
    collectors = [PY, "-c", BASELINE_COLLECTOR] if baseline else [PY, "-m", "collectors"]
    proc = subprocess.Popen(
        [*collectors, "--config", str(config), "--database-url", db_url, "--log-level", "WARNING"],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: os.sched_setaffinity(0, collector_cpu),
    )
    try:
        # a loaded machine can take longer than the warm-up to start the process: count from its first write
        wait_for(
            lambda: (tmp / "fleet.db").exists(), 300, "the collector to create its database", interval=0.5
        )
        db = make_engine(db_url, read_only=True)

        def scrapes() -> int:
            with db.connect() as conn:
                return conn.execute(
                    select(func.count())
                    .select_from(Sample)
                    .join(Series, Series.id == Sample.series_id)
                    .where(Series.signal == "up")
                ).scalar()

        wait_for(scrapes, 300, "the collector's first stored scrape", interval=0.5, tolerate=(Exception,))
        time.sleep(warmup)

        c0, s0, t0 = _cpu_seconds(proc.pid), scrapes(), time.monotonic()
        time.sleep(seconds)
        c1, s1, t1 = _cpu_seconds(proc.pid), scrapes(), time.monotonic()
        rss_mb = (
            int(
                next(
                    line.split()[1]
                    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")
                )
            )
            / 1024
        )
        db.dispose()
    finally:
        # SIGTERM drains the writer's queue; on a loaded machine that can outlast any fixed wait
        for child, grace in ((proc, 60), (server, 10)):
            child.terminate()
            try:
                child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=30)
        log.close()
    elapsed = t1 - t0
    rate = (s1 - s0) / elapsed
    cpu_share = (c1 - c0) / elapsed
    return {
        "engines": n,
        "reader": "prometheus_client (baseline)" if baseline else "core.engine_metrics.text",
        "scrapes_per_s": round(rate, 1),
        "target_scrapes_per_s": n,
        "achieved_fraction": round(rate / n, 3),
        "collector_cpu_share": round(cpu_share, 3),
        "cpu_ms_per_scrape": round(1000 * (c1 - c0) / max(1, s1 - s0), 2),
        "engines_per_core_estimate": int(rate / cpu_share) if cpu_share > 0 else None,
        "collector_rss_mb": round(rss_mb),
        "sustained": rate >= 0.97 * n and cpu_share < 0.95,
    }


# ------------------------------------------------------------------ 3. queries


def bench_queries(runs: int, db_path: Path, raw_hours: float, rollup_days: float) -> dict:
    from bench.build_bench_db import build_bench_db
    from db import make_engine, queries

    t0 = time.perf_counter()
    info = build_bench_db(f"sqlite:///{db_path}", engines=8, raw_hours=raw_hours, rollup_days=rollup_days)
    build_s = time.perf_counter() - t0
    db = make_engine(f"sqlite:///{db_path}", read_only=True)
    end = info["end_ts"] + 59.0  # a live view: up to now, including raw samples past the watermark
    with db.connect() as conn:
        engine_ids = [t["id"] for t in queries.targets(conn, role="engine")]
    results: dict[str, float] = {}
    points: dict[str, int] = {}
    for label, span in (("24h", 86400.0), ("7d", 7 * 86400.0)):
        one, fleet = [], []
        for _ in range(runs):
            with db.connect() as conn:
                t = time.perf_counter()
                r = queries.series_range(
                    conn, signals=ENGINE_VIEW, start_ts=end - span, end_ts=end, target_ids=[engine_ids[0]]
                )
                queries.latest_signals(conn, target_ids=[engine_ids[0]])
                one.append(time.perf_counter() - t)
                t = time.perf_counter()
                f = queries.series_range(
                    conn, signals=["engine_hit_ratio"], start_ts=end - span, end_ts=end, target_ids=engine_ids
                )
                fleet.append(time.perf_counter() - t)
        results[f"engine_view_{label}_ms"] = median_ms(one)
        results[f"fleet_hit_ratio_{label}_ms"] = median_ms(fleet)
        points[f"{label}_points_per_series"] = max(len(s["ts"]) for s in r["series"])
        points[f"{label}_resolution"] = f"{r['resolution']} / {r['bucket_s']:g} s"
        assert len(f["series"]) == 8
    # Baseline in the same run: the 24 h view of one engine read from raw samples (what a query
    # without rollups has to do), 15 s buckets.
    base = []
    for _ in range(min(runs, 3)):
        with db.connect() as conn:
            t_b = time.perf_counter()
            queries.series_range(
                conn,
                signals=ENGINE_VIEW,
                start_ts=end - 86400.0,
                end_ts=end,
                target_ids=[engine_ids[0]],
                resolution="raw",
            )
            base.append(time.perf_counter() - t_b)
    results["engine_view_24h_from_raw_baseline_ms"] = median_ms(base)
    with db.connect() as conn:
        t = [0.0] * runs
        for i in range(runs):
            s = time.perf_counter()
            queries.latest_signals(conn)
            t[i] = time.perf_counter() - s
    results["latest_signals_all_ms"] = median_ms(t)
    db.dispose()
    size_mb = sum(p.stat().st_size for p in db_path.parent.glob(db_path.name + "*")) / 1e6
    return {
        **results,
        **points,
        "db_raw_rows": info["raw_rows"],
        "db_rollup_rows": info["rollup_rows"],
        "db_size_mb": round(size_mb),
        "db_build_s": round(build_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="PrefixOps collectors benchmark")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--skip-fleet", action="store_true")
    p.add_argument("--no-baseline", action="store_true", help="fleet runs without the reader baseline")
    p.add_argument(
        "--skip-queries", action="store_true", help="no query benchmark (it builds a large database)"
    )
    p.add_argument("--fleet", type=int, nargs="*", default=None, help="fleet sizes (default 200 400)")
    p.add_argument("--fleet-seconds", type=float, default=20.0)
    p.add_argument("--db", default=str(REPO / "bench" / "out" / "bench-collectors.db"))
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    fleet_sizes = args.fleet if args.fleet is not None else ([200] if args.quick else [200, 400])
    raw_hours, rollup_days = (2.0, 1.0) if args.quick else (24.0, 7.0)
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    out: dict = {"cpus": os.cpu_count(), "runs": args.runs}
    print(f"collectors benchmark ({args.runs} runs, medians; {os.cpu_count()} CPUs)")
    ps = bench_parse_store(args.runs, 200 if args.quick else 500)
    out["parse_store"] = ps
    print(
        f"1. vLLM 0.33 page: parse full page {ps['parse_full_page_ms']:.2f} ms (baseline) vs filtered "
        f"{ps['parse_filtered_ms']:.2f} ms ({ps['parse_full_page_ms'] / ps['parse_filtered_ms']:.1f}x); "
        f"reader baseline (filtered page through prometheus_client) {ps['parse_filtered_prometheus_client_ms']:.2f} ms "
        f"({ps['parse_filtered_prometheus_client_ms'] / ps['parse_filtered_ms']:.2f}x); "
        f"parse+store {ps['parse_store_single_ms']:.2f} ms per scrape (own transaction), "
        f"{ps['parse_store_batched_ms']:.2f} ms batched 200/transaction (of which store "
        f"{ps['store_batched_ms']:.3f} ms)"
    )
    if not args.skip_fleet:
        out["fleet"] = []
        for n in fleet_sizes:
            for baseline in (False,) if args.no_baseline else (False, True):
                f = bench_fleet(n, args.fleet_seconds if not args.quick else 10.0, baseline=baseline)
                out["fleet"].append(f)
                print(
                    f"2. fleet of {n} engines at 1 s, reader {f['reader']}, collector pinned to one CPU: "
                    f"{f['scrapes_per_s']} scrapes/s ({f['achieved_fraction']:.0%} of target), "
                    f"CPU {f['collector_cpu_share']:.0%} of one core, {f['cpu_ms_per_scrape']} ms CPU/scrape "
                    f"-> ~{f['engines_per_core_estimate']} engines per core, RSS {f['collector_rss_mb']} MB; "
                    f"sustained: {f['sustained']}"
                )
            if not args.no_baseline:
                new, base = (
                    out["fleet"][-2]["engines_per_core_estimate"],
                    out["fleet"][-1]["engines_per_core_estimate"],
                )
                if new and base:
                    print(
                        f"   engines per core at {n}: {new} vs {base} with the reader baseline ({new / base:.2f}x)"
                    )
    if not args.skip_queries:
        q = bench_queries(args.runs, Path(args.db), raw_hours, rollup_days)
        out["queries"] = q
        print(
            f"3. DB: {q['db_raw_rows']:,} raw + {q['db_rollup_rows']:,} rollup rows, {q['db_size_mb']} MB "
            f"(built/reused in {q['db_build_s']} s)"
        )
        for label in ("24h", "7d"):
            print(
                f"   {label} engine view (6 signals + latest): {q[f'engine_view_{label}_ms']:.1f} ms, "
                f"{q[f'{label}_points_per_series']} points/series ({q[f'{label}_resolution']}); "
                f"hit ratio of 8 engines: {q[f'fleet_hit_ratio_{label}_ms']:.1f} ms"
            )
        print(
            f"   baseline: the 24h engine view from raw samples (no rollups): "
            f"{q['engine_view_24h_from_raw_baseline_ms']:.0f} ms "
            f"({q['engine_view_24h_from_raw_baseline_ms'] / q['engine_view_24h_ms']:.0f}x slower)"
        )
        print(f"   latest signals of every target: {q['latest_signals_all_ms']:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    asyncio.get_event_loop_policy()  # keep the asyncio import honest for the fleet server text
    sys.exit(main())
