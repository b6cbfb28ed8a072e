"""Dashboard benchmarks (issue 6): Engine page build time, and freshness from an engine change to the chart.

1. **Engine page build time**, server side: one full script run of `app.py` on the
   Engine page (sidebar, status, every query, every plotly figure, serialisation)
   through `streamlit.testing.v1.AppTest`, on the collectors' benchmark database
   (`bench/build_bench_db.py`: 2 engines + 2 sidecars, 24 h of 1 s raw samples, 7 days
   of 1-minute rollups). Cold = caches cleared before the run; warm = the next run.
   Ranges 24 h and 7 d, ending at the database's newest sample (targets: <= 300 ms each), with 15 min as the baseline measured
   in the same run. Medians of `--runs` runs, wall time and the process's CPU time (the
   latter is what an idle machine would take; the machines here are shared and noisy).
2. **Overview at fleet scale** (issue 13): one full cold script run of the Overview (counts by state,
   the fleet table worst first, five distribution charts) over `--fleet-engines` engines and as many
   sidecars (`build_bench_db.py --engines N --sidecars N --raw-hours 1 --rollup-days 1`), against the
   2-engine database as the baseline measured in the same run (target: <= 2 s at 200 engines).
3. **Freshness**: a stub vLLM `/metrics` (a capture from tests/fixtures with
   `vllm:num_requests_waiting` set by the bench), the real collectors (`python -m
   collectors`, 1 s interval) and `streamlit run app.py` (default 2 s refresh), the
   Overview open in Debian's Chromium. Each trial sets a new value at the engine and
   times until the browser's plotly chart holds it (target <= 3 s). Median and max.

    .venv/bin/python bench/bench_dashboard.py            # both; prints JSON, writes bench/out/dashboard.json
    .venv/bin/python bench/bench_dashboard.py --skip-freshness --runs 7
    .venv/bin/python bench/bench_dashboard.py --skip-freshness --skip-build-time   # the Overview only
    .venv/bin/python bench/bench_dashboard.py --live-under-load --runs 2 --busy 8  # charts drawn under load
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.build_bench_db import build_bench_db  # noqa: E402

OUT = REPO / "bench" / "out"
CAPTURE = REPO / "tests" / "fixtures" / "engine-metrics" / "vllm-0.33.0-statlogger.prom"
SPANS = {"15m": 900.0, "24h": 86400.0, "7d": 7 * 86400.0}
# the last commit whose live panels refreshed at a fixed interval (st.fragment(run_every=2 s))
LIVE_BASELINE_REF = "28d7653"
WAITING_RE = re.compile(r"^(vllm:num_requests_waiting\{[^}]*\}) \S+$", re.MULTILINE)


# ------------------------------------------------------------------------------------ build time
def engine_page_times(url: str, engine: str, ranges: list[str], runs: int, end_ts: float) -> dict[str, Any]:
    """Each range ends at the database's newest sample (`?at=` centres the window; the page clips it)."""
    os.environ.update(
        {"DATABASE_URL": url, "PREFIXOPS_STALE_SECONDS": "1e9", "PREFIXOPS_HEARTBEAT_STALE_SECONDS": "1e9"}
    )
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    results: dict[str, Any] = {}
    for label in ranges:
        cold: list[float] = []
        cold_cpu: list[float] = []
        warm: list[float] = []
        points = 0
        for _ in range(runs):
            at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
            at.run()
            at.switch_page("pages/engine.py")
            at.query_params["engine"] = engine
            at.query_params["range"] = label
            at.query_params["at"] = str(end_ts - SPANS[label] / 2)
            st.cache_data.clear()
            started, cpu = time.perf_counter(), time.process_time()
            at.run()
            cold.append((time.perf_counter() - started) * 1000)
            cold_cpu.append((time.process_time() - cpu) * 1000)
            assert not at.exception, at.exception
            started = time.perf_counter()
            at.run()
            warm.append((time.perf_counter() - started) * 1000)
            points = sum(len(json.loads(e.proto.spec)["data"]) for e in at.get("plotly_chart"))
        results[label] = {
            "cold_ms_median": round(statistics.median(cold), 1),
            "cold_ms_max": round(max(cold), 1),
            "cold_cpu_ms_median": round(statistics.median(cold_cpu), 1),
            "warm_ms_median": round(statistics.median(warm), 1),
            "traces": points,
            "runs": runs,
        }
    base = results[ranges[0]]["cold_ms_median"]
    for label in ranges:
        results[label]["cold_vs_baseline"] = (
            round(results[label]["cold_ms_median"] / base, 2) if base else None
        )
    return results


def overview_times(urls: dict[str, tuple[str, float]], runs: int) -> dict[str, Any]:
    """Cold (caches cleared) and warm full runs of the Overview per database (url, its newest sample's time),
    the last hour paused at that time; the first database is the baseline."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    results: dict[str, Any] = {}
    for label, (url, end_ts) in urls.items():
        os.environ.update(
            {
                "DATABASE_URL": url,
                "PREFIXOPS_STALE_SECONDS": "1e9",
                "PREFIXOPS_HEARTBEAT_STALE_SECONDS": "1e9",
            }
        )
        cold, cold_cpu, warm = [], [], []
        rows = traces = 0
        for _ in range(runs):
            at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
            at.query_params["range"] = "1h"
            at.query_params["to"] = f"{end_ts:.0f}"
            at.run()
            st.cache_data.clear()
            started, cpu = time.perf_counter(), time.process_time()
            at.run()
            cold.append((time.perf_counter() - started) * 1000)
            cold_cpu.append((time.process_time() - cpu) * 1000)
            assert not at.exception, at.exception
            started = time.perf_counter()
            at.run()
            warm.append((time.perf_counter() - started) * 1000)
            rows = len(at.dataframe[0].value) if at.dataframe else 0
            traces = sum(len(json.loads(e.proto.spec)["data"]) for e in at.get("plotly_chart"))
        results[label] = {
            "cold_ms_median": round(statistics.median(cold), 1),
            "cold_ms_max": round(max(cold), 1),
            "cold_cpu_ms_median": round(statistics.median(cold_cpu), 1),
            "warm_ms_median": round(statistics.median(warm), 1),
            "table_rows": rows,
            "traces": traces,
            "runs": runs,
        }
    base = next(iter(results.values()))["cold_ms_median"]
    for entry in results.values():
        entry["cold_vs_baseline"] = round(entry["cold_ms_median"] / base, 2) if base else None
    return results


def query_times(url: str, runs: int) -> dict[str, float]:
    """The database part alone: the Engine page's two series queries, per range."""
    from dashboard import engine_view
    from dashboard import frames as q
    from db import make_engine

    engine = make_engine(url, read_only=True)
    with engine.connect() as conn:
        ref = q.list_engines(conn)[0]
        end = max(v for v in (q.latest(conn, ref.target_ids).values.values()))[0]
        out = {}
        for label, span in (("15m", 900), ("24h", 86400), ("7d", 7 * 86400)):
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                # the Engine page's own signal lists, so the bench times what the page reads
                q.series_frame(conn, [ref.sidecar_target_id], engine_view.SIDECAR_SIGNALS, end - span, end)
                q.series_frame(conn, [ref.engine_target_id], engine_view.ENGINE_SIGNALS, end - span, end)
                times.append((time.perf_counter() - started) * 1000)
            out[label] = round(statistics.median(times), 1)
    engine.dispose()
    return out


# ------------------------------------------------------------------------------------ freshness
class StubEngine:
    """Serves a real vLLM /metrics capture with `vllm:num_requests_waiting` set by the bench."""

    def __init__(self) -> None:
        self.template = CAPTURE.read_text()
        self.waiting = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/metrics"):
                    body = WAITING_RE.sub(lambda m: f"{m.group(1)} {stub.waiting}.0", stub.template).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                else:
                    body = b"{}"
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


LAST_WAITING_JS = """() => {
  for (const el of document.querySelectorAll('.js-plotly-plot')) {
    for (const t of (el._fullData || [])) {
      if (t.name && t.name.endsWith(' waiting') && t.y && t.y.length) {
        for (let i = t.y.length - 1; i >= 0; i--) { if (t.y[i] !== null && !Number.isNaN(t.y[i])) return t.y[i]; }
      }
    }
  }
  return null;
}"""


def freshness(trials: int) -> dict[str, Any]:
    from tests.browser.pw import browser_page, open_page, streamlit_app
    from tests.support import PYTHON, running

    stub = StubEngine()
    tmp = Path(tempfile.mkdtemp(prefix="bench-dash-"))
    url = f"sqlite:///{tmp / 'fresh.db'}"
    samples: list[float] = []
    try:
        with running(
            [PYTHON, "-m", "collectors", "--engine", stub.url, "--database-url", url, "--interval", "1"],
            name="collectors",
        ):
            deadline = time.monotonic() + 60
            while not (tmp / "fresh.db").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(2.5)
            with streamlit_app(url) as base, browser_page() as page:
                open_page(page, f"{base}/")
                deadline = time.monotonic() + 60
                while page.evaluate(LAST_WAITING_JS) is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                for i in range(trials):
                    value = 11 + 7 * i
                    time.sleep(1.3 * (i % 3))  # spread the change's phase against scrape and refresh ticks
                    stub.waiting = value
                    started = time.monotonic()
                    while page.evaluate(LAST_WAITING_JS) != value:
                        if time.monotonic() - started > 30:
                            raise RuntimeError(f"value {value} never reached the chart")
                        time.sleep(0.05)
                    samples.append(time.monotonic() - started)
    finally:
        stub.close()
    return {
        "trials": trials,
        "median_s": round(statistics.median(samples), 2),
        "max_s": round(max(samples), 2),
        "min_s": round(min(samples), 2),
        "samples_s": [round(s, 2) for s in samples],
        "scrape_interval_s": 1.0,
        "refresh_s": 2.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default=str(OUT / "bench-dashboard.db"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--skip-freshness", action="store_true")
    p.add_argument("--skip-build-time", action="store_true")
    p.add_argument("--skip-overview", action="store_true")
    p.add_argument("--fleet-engines", type=int, default=200)
    p.add_argument("--fleet-db", default=str(OUT / "fleet200.db"))
    p.add_argument(
        "--live-under-load",
        action="store_true",
        help="only the live Engine page in Chromium on a loaded machine, against --baseline-ref (dashboard_load.py)",
    )
    p.add_argument("--baseline-ref", default=LIVE_BASELINE_REF)
    p.add_argument("--busy", type=int, default=8, help="busy loops at nice 0 during --live-under-load")
    p.add_argument("--seconds", type=float, default=90.0, help="how long each page is watched")
    args = p.parse_args(argv)
    if args.live_under_load:
        from bench.dashboard_load import live_under_load

        load = live_under_load(args.baseline_ref, args.busy, args.seconds, args.runs)
        load["load_avg_at_start"] = [round(x, 2) for x in os.getloadavg()]
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "dashboard-load.json").write_text(json.dumps(load, indent=2))
        print(json.dumps({k: v for k, v in load.items() if k != "runs"}, indent=2))
        return 0
    url = f"sqlite:///{Path(args.db).resolve()}"
    result: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    if not args.skip_build_time:
        info = build_bench_db(url, engines=2, sidecars=2)
        result["bench_db"] = {k: info.get(k) for k in ("series", "raw_rows", "rollup_rows")}
        result["engine_page"] = engine_page_times(
            url, "engine-0", ["15m", "24h", "7d"], args.runs, float(info["end_ts"])
        )
        result["engine_page_queries_ms"] = query_times(url, args.runs)
    if not args.skip_overview:
        base = build_bench_db(url, engines=2, sidecars=2)
        fleet_url = f"sqlite:///{Path(args.fleet_db).resolve()}"
        fleet = build_bench_db(
            fleet_url, engines=args.fleet_engines, sidecars=args.fleet_engines, raw_hours=1.0, rollup_days=1.0
        )
        result["overview"] = overview_times(
            {
                "2 engines (baseline)": (url, float(base["end_ts"])),
                f"{args.fleet_engines} engines": (fleet_url, float(fleet["end_ts"])),
            },
            args.runs,
        )
    if not args.skip_freshness:
        result["freshness"] = freshness(args.trials)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "dashboard.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
