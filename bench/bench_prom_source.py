"""Prometheus as a fleet source: one collector cycle over 1,000 engines read from a real Prometheus, against
scraping the same 1,000 engines directly, in the same run.

    .venv/bin/python bench/bench_prom_source.py [--engines 1000] [--runs 5] [--scrape-interval 2]

Set-up: bench/fleet_exporter.py serves 1,000 synthetic vLLM engines on one port: all of them on
``/metrics`` (each with its own ``instance`` label; Prometheus scrapes it with ``honor_labels``), and each
alone on ``/engine/<i>/metrics``. A real Prometheus (Debian's, ``/usr/bin/prometheus``) scrapes the
fleet page every --scrape-interval seconds into temporary storage.

Measured, in this process (the collector), as CPU time (``time.process_time``: every thread) and wall
time, median of --runs cycles after two warm-up cycles (the first registers the targets and series):

- **prometheus**: one cycle of a ``kind = "prometheus"`` target: the instant queries (one per signal
  family), building every engine's page and rates, and ``Collector.process`` (database writes in one
  SQLite transaction, alert evaluation);
- **direct (baseline)**: one cycle of 1,000 ``EngineScraper`` targets: 1,000 GETs (64 threads, as
  ``--once`` does), parsing, rates, and the same ``Collector.process``.

Target: the prometheus cycle costs at most 1 s of collector CPU. Prints one JSON line and a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collectors.config import CollectorConfig, EngineTarget  # noqa: E402
from collectors.service import Collector  # noqa: E402
from db import make_engine  # noqa: E402
from db.migrate import upgrade  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def measure(cycle: Callable[[], int], runs: int, pause_s: float) -> dict[str, float]:
    cpu, wall, outcomes = [], [], []
    for i in range(runs + 2):
        c0, w0 = time.process_time(), time.perf_counter()
        n = cycle()
        c1, w1 = time.process_time(), time.perf_counter()
        if i >= 2:
            cpu.append(c1 - c0)
            wall.append(w1 - w0)
            outcomes.append(n)
        time.sleep(pause_s)
    return {
        "cpu_s": statistics.median(cpu),
        "wall_s": statistics.median(wall),
        "cpu_max_s": max(cpu),
        "engines_written": statistics.median(outcomes),
    }


def drain(collector: Collector) -> list:
    out = []
    while not collector.queue.empty():
        out.append(collector.queue.get_nowait())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Prometheus-source collector cycle vs direct scraping (same run)."
    )
    p.add_argument("--engines", type=int, default=1000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--scrape-interval", type=float, default=2.0, help="Prometheus scrape interval, seconds")
    args = p.parse_args(argv)
    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(prometheus).exists():
        raise SystemExit("needs Debian's prometheus (apt-get install --no-install-recommends prometheus)")

    with tempfile.TemporaryDirectory(prefix="bench-prom-") as tmp:
        root = Path(tmp)
        exporter_port, prom_port = free_port(), free_port()
        interval = f"{args.scrape_interval:g}s"
        (root / "prometheus.yml").write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": interval},
                    "scrape_configs": [
                        {
                            "job_name": "vllm",
                            "honor_labels": True,
                            "scrape_interval": interval,
                            "scrape_timeout": interval,
                            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
                        }
                    ],
                }
            )
        )
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "bench" / "fleet_exporter.py"),
                    "--port",
                    str(exporter_port),
                    "--engines",
                    str(args.engines),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            ),
            subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            ),
        ]
        prom_url = f"http://127.0.0.1:{prom_port}"
        try:
            wait_for(lambda: httpx.get(f"{prom_url}/-/ready").status_code == 200, 60, "Prometheus")
            wait_for(
                lambda: (
                    len(
                        httpx.get(
                            f"{prom_url}/api/v1/query", params={"query": "vllm:num_requests_running"}
                        ).json()["data"]["result"]
                    )
                    == args.engines
                ),
                90,
                f"{args.engines} engines in Prometheus",
            )

            db_prom = make_engine(f"sqlite:///{root / 'prom.db'}")
            upgrade(db_prom)
            source = EngineTarget(prom_url, kind="prometheus", matchers='job="vllm"')
            c_prom = Collector(
                CollectorConfig(engines=(source,), interval_s=args.scrape_interval, timeout_s=30.0), db_prom
            )

            def prom_cycle() -> int:
                c_prom.scrape_target(prom_url)
                batch = drain(c_prom)
                c_prom.process(batch)
                return sum(1 for o in batch if o.ok and o.url != prom_url)

            prom = measure(prom_cycle, args.runs, args.scrape_interval)

            db_direct = make_engine(f"sqlite:///{root / 'direct.db'}")
            upgrade(db_direct)
            targets = tuple(
                EngineTarget(f"http://127.0.0.1:{exporter_port}/engine/{i}", kind="vllm")
                for i in range(args.engines)
            )
            c_direct = Collector(CollectorConfig(engines=targets, interval_s=1.0, timeout_s=30.0), db_direct)
            scrapers = list(c_direct.scrapers.values())
            pool = ThreadPoolExecutor(64)

            def direct_cycle() -> int:
                outcomes = list(pool.map(lambda s: s.scrape(c_direct.client), scrapers))
                c_direct.process(outcomes)
                return sum(1 for o in outcomes if o.ok)

            direct = measure(direct_cycle, args.runs, 1.0)
            pool.shutdown()
            c_prom.client.close()
            c_direct.client.close()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)

    result = {
        "engines": args.engines,
        "runs": args.runs,
        "prometheus": prom,
        "direct": direct,
        "cpu_ratio_direct_over_prometheus": round(direct["cpu_s"] / prom["cpu_s"], 2),
        "target_cpu_s": 1.0,
        "meets_target": prom["cpu_s"] <= 1.0,
    }
    print(json.dumps(result))
    print(
        f"\n{'one collector cycle, ' + str(args.engines) + ' engines':<42} {'CPU s':>8} {'wall s':>8} {'engines':>8}"
    )
    for name, r in (("prometheus source (target <= 1 s CPU)", prom), ("direct scraping (baseline)", direct)):
        print(f"{name:<42} {r['cpu_s']:>8.3f} {r['wall_s']:>8.3f} {r['engines_written']:>8.0f}")
    print(f"direct / prometheus CPU: {result['cpu_ratio_direct_over_prometheus']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
