"""The live Engine page in a browser on a busy machine: are its charts drawn? (`bench_dashboard.py --live-under-load`)

Two `streamlit run app.py` servers over the same filled database (`tests/dashboard/fill.py`), default
2 s refresh: the code of ``--baseline-ref`` (checked out with `git archive` into a temporary directory)
and the working tree. ``--busy`` busy loops at nice 0 (spread over the cores) load the machine for
the whole run, on top of whatever else runs. In each round both servers start and a headless Chromium
for each opens its live Engine page at the same time (so both see the same load), polling it every
second for ``--seconds``:

- ``first_drawn_s``: seconds until every chart element on the page has a plotly line drawn (None:
  never within the window; the page shows grey skeletons until then);
- ``drawn_share``: the share of polls in which every chart was drawn;
- ``idle_share``: the share of polls in which no script run was in progress (a page whose refresh
  queues a rerun behind one that has not finished is never idle).

The result is the working tree against the baseline measured in the same run (medians over rounds).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from io import BytesIO
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

POLL_JS = """() => {
  const charts = [...document.querySelectorAll("[data-testid='stPlotlyChart']")];
  const drawn = charts.filter(c => [...c.querySelectorAll('path.js-line')]
      .some(p => (p.getAttribute('d') || '').includes('L'))).length;
  const app = document.querySelector("[data-testid='stApp']");
  return {charts: charts.length, drawn, state: app ? app.getAttribute('data-test-script-state') : null};
}"""


def _checkout(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _watch(base: str, path: str, seconds: float) -> dict[str, Any]:
    from tests.browser.pw import browser_page

    polls: list[dict[str, Any]] = []
    with browser_page() as page:
        page.set_default_timeout(int(seconds * 1000) + 60_000)
        started = time.monotonic()
        page.goto(f"{base}/{path}", wait_until="commit")
        while time.monotonic() - started < seconds:
            try:
                poll = page.evaluate(POLL_JS)
            except Exception:  # noqa: BLE001 - a page mid-navigation: count the poll as not drawn
                poll = {"charts": 0, "drawn": 0, "state": None}
            poll["t"] = round(time.monotonic() - started, 1)
            polls.append(poll)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started - poll["t"])))
    drawn = [p for p in polls if p["charts"] and p["drawn"] == p["charts"]]
    return {
        "first_drawn_s": drawn[0]["t"] if drawn else None,
        "drawn_share": round(len(drawn) / len(polls), 2) if polls else 0.0,
        "idle_share": round(sum(p["state"] == "notRunning" for p in polls) / len(polls), 2) if polls else 0.0,
        "polls": len(polls),
    }


def live_under_load(baseline_ref: str, busy: int, seconds: float, rounds: int) -> dict[str, Any]:
    from tests.browser.pw import FRESH_FILL
    from tests.dashboard.fill import filled_engine
    from tests.support import PYTHON, free_port, running

    tmp = Path(tempfile.mkdtemp(prefix="bench-dash-load-"))
    db = tmp / "filled.db"
    engine, _now = filled_engine(f"sqlite:///{db}")
    engine.dispose()
    trees = {"baseline": _checkout(baseline_ref, tmp / "baseline"), "this tree": REPO}
    env = {"DATABASE_URL": f"sqlite:///{db}", **FRESH_FILL, "PREFIXOPS_REFRESH_SECONDS": "2"}
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(busy)
    ]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    try:
        for _ in range(rounds):
            with ExitStack() as stack:
                bases = {}
                for name, tree in trees.items():
                    port = free_port()
                    cmd = [PYTHON, "-m", "streamlit", "run", "app.py", "--server.port", str(port)]
                    cmd += ["--server.headless", "true"]
                    bases[name] = f"http://127.0.0.1:{port}"
                    stack.enter_context(
                        running(
                            cmd,
                            name=f"streamlit-{name}",
                            cwd=tree,
                            env=env,
                            ready_url=f"{bases[name]}/_stcore/health",
                            expect_text="ok",
                            timeout=180,
                        )
                    )
                # both pages watched at the same time, so both see the same load
                with ProcessPoolExecutor(max_workers=len(trees)) as pool:
                    futures = {
                        name: pool.submit(_watch, base, "engine?engine=a", seconds)
                        for name, base in bases.items()
                    }
                    for name, future in futures.items():
                        results[name].append(future.result())
    finally:
        for loop in loops:
            loop.terminate()
        for loop in loops:
            loop.wait()

    def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
        firsts = [r["first_drawn_s"] for r in runs]
        known = [f for f in firsts if f is not None]
        return {
            "first_drawn_s": firsts,
            "drawn_share_median": statistics.median(r["drawn_share"] for r in runs),
            "idle_share_median": statistics.median(r["idle_share"] for r in runs),
            "never_drawn_rounds": firsts.count(None),
            "first_drawn_s_median_when_drawn": statistics.median(known) if known else None,
        }

    out: dict[str, Any] = {name: summary(runs) for name, runs in results.items()}
    base_share = out["baseline"]["drawn_share_median"]
    out["drawn_share_vs_baseline"] = (
        round(out["this tree"]["drawn_share_median"] / base_share, 2) if base_share else None
    )
    out.update(baseline_ref=baseline_ref, busy_loops=busy, seconds=seconds, rounds=rounds, runs=results)
    return out
