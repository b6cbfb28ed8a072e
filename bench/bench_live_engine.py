"""The simulated engine's delivery: the latency outside its own clock, garbage collected between the
loop's turns (the default) against Python's automatic collection (``simulator serve --gc auto``).

``python bench/bench_live_engine.py [--rounds 2] [--sessions 13] [--warm 25] [--measure 40]`` starts
the collapse demo's simulated engine (x10) and sidecar (`demo.stack.build_services`), drives them with
``simulator loadgen``: ``--sessions`` closed-loop agent sessions at the recovered collapse demo's shape
(first prompts of 10K tokens growing 160 a turn, 150-token streamed answers, 1.5 simulated seconds of
tool time), and after ``--warm`` seconds measures over ``--measure`` seconds how much longer the turns
took at the sidecar than the engine's own clock says (`simulator.forecast_validate.latency_outside`:
the turns' mean ``latency_s`` minus the engine's exact mean e2e). It alternates the two collection
policies, a fresh engine each run, so the machine's noise hits both alike, and prints the medians and
their ratio. That time is what a forecast has to estimate from what it recorded (docs/dashboard.md,
"Validation", "Session 11"): the smaller and the steadier, the better.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo.services import wait_ready  # noqa: E402
from demo.stack import build_services, set_control_mode  # noqa: E402
from simulator.forecast_validate import e2e_totals, latency_outside, turns_between  # noqa: E402

ENGINE_PORT, SIDECAR_PORT = 18610, 18611


def one_run(policy: str, args: argparse.Namespace, data_dir: Path) -> tuple[float, float]:
    """(latency outside the engine's clock in seconds, turns/s) over the measured span of one run."""
    token = secrets.token_urlsafe(24)
    ns = argparse.Namespace(
        host="127.0.0.1",
        engine_port=ENGINE_PORT,
        sidecar_port=SIDECAR_PORT,
        dashboard_port=0,
        scenario="collapse",
        speed=10.0,
        data_dir=data_dir,
        database_url=None,
        seed=1,
        engine="simulator",
        engine_url=None,
    )
    data_dir.mkdir(parents=True)
    services = build_services(ns, token)
    engine, sidecar = services[0], services[1]
    engine.cmd = [*engine.cmd, "--gc", policy]
    engine_url, sidecar_url = f"http://127.0.0.1:{ENGINE_PORT}", f"http://127.0.0.1:{SIDECAR_PORT}"
    load = None
    try:
        for s in (engine, sidecar):
            s.start()
            wait_ready(s, timeout=90)
        set_control_mode(sidecar_url, token, "off")
        # with a 50-a-second arrival rate every session is in within a second; each lasts the whole run
        flags = (
            f"--sessions-per-s 50 --max-sessions {args.sessions} --turns 1000 --initial-context 10000 "
            "--context-growth 160 --output-tokens 150 --tool-latency 1.5 --stream-fraction 1 --seed 3 "
            f"--duration {args.warm + args.measure + 10}"
        )
        load = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "simulator",
                "loadgen",
                "--target",
                sidecar_url,
                "--speed",
                "10",
                *flags.split(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(args.warm)
        t0, before = time.time(), e2e_totals(engine_url)
        time.sleep(args.measure)
        t1, after = time.time(), e2e_totals(engine_url)
        turns = turns_between(sidecar_url, token, t0, t1)
        outside = latency_outside(turns, before, after)
        if outside is None:
            raise SystemExit(f"no turn to measure in the {policy} run: see {data_dir}/logs")
        done = sum(1 for t in turns if t.get("outcome") == "ok")
        return outside, done / (t1 - t0)
    finally:
        if load is not None:
            load.kill()
            load.wait()
        for s in (sidecar, engine):
            s.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="runs of each policy, alternated")
    p.add_argument("--sessions", type=int, default=13, help="the recovered collapse demo admits 13-14")
    p.add_argument("--warm", type=float, default=25.0, help="wall seconds before the measurement")
    p.add_argument("--measure", type=float, default=40.0, help="wall seconds measured")
    args = p.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"loop": [], "auto": []}
    root = Path(tempfile.mkdtemp(prefix="bench-live-engine-"))
    try:
        for i in range(args.rounds):
            for policy in ("loop", "auto"):
                outside, rate = one_run(policy, args, root / f"{policy}-{i}")
                results[policy].append((outside, rate))
                print(
                    f"run {i + 1} gc {policy:4s}: outside the engine's clock {outside * 1000:6.1f} ms a turn, "
                    f"{rate:5.1f} turns/s",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(o for o, _ in v) for k, v in results.items()}
    print(f"\n{args.sessions} sessions at x10, median of {args.rounds} runs each:")
    print(f"  collected between the loop's turns (default): {med['loop'] * 1000:6.1f} ms a turn")
    print(f"  Python's automatic collection (--gc auto):    {med['auto'] * 1000:6.1f} ms a turn")
    print(f"  auto / loop: {med['auto'] / med['loop']:.2f}x" if med["loop"] > 0 else "  loop: 0 ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
