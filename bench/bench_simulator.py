"""Simulator speed: simulated minutes per wall second, default (fast) vs exact mode.

``python bench/bench_simulator.py [--runs 3] [--minutes 90] [--seed 2]`` runs the
issue's benchmark workload (``agent-burst`` under ``budgeter-park``, 90 simulated
minutes) several times in each mode, alternating modes so machine noise hits
both alike, and prints the median of ``summary.wall_s`` (simulation only: no
start-up, no plotting) as simulated minutes per wall second, plus the ratio.
Targets (issue 3): default >= 100 (aim 300), exact >= 20.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulator.offline import run_scenario  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--minutes", type=float, default=90.0)
    p.add_argument(
        "--seed", type=int, default=2, help="seed 2 collapses and recovers: both regimes are timed"
    )
    p.add_argument("--scenario", default="agent-burst")
    p.add_argument("--control", default="budgeter-park")
    args = p.parse_args()
    walls: dict[str, list[float]] = {"fast": [], "exact": []}
    cpus: dict[str, list[float]] = {"fast": [], "exact": []}
    for i in range(args.runs):
        for mode in ("fast", "exact"):
            cpu0 = time.process_time()
            res = run_scenario(args.scenario, args.control, args.seed, args.minutes, exact=mode == "exact")
            cpus[mode].append(time.process_time() - cpu0)
            walls[mode].append(res["summary"]["wall_s"])
            print(
                f"run {i + 1} {mode:5s}: {res['summary']['wall_s']:.3f} s wall "
                f"({args.minutes / res['summary']['wall_s']:.1f} sim-min/s), {cpus[mode][-1]:.3f} s CPU",
                flush=True,
            )
    med = {m: statistics.median(w) for m, w in walls.items()}
    speed = {m: args.minutes / med[m] for m in med}
    cpu_speed = {m: args.minutes / statistics.median(c) for m, c in cpus.items()}
    print(
        f"\n{args.scenario} / {args.control} / seed {args.seed}, {args.minutes:g} simulated minutes, "
        f"median of {args.runs} runs:"
    )
    print(f"  default (fast) mode: {speed['fast']:8.1f} simulated min per wall s  (target >= 100, aim 300)")
    print(f"  exact mode:          {speed['exact']:8.1f} simulated min per wall s  (target >= 20)")
    print(f"  fast / exact:        {speed['fast'] / speed['exact']:8.1f}x")
    print(
        f"  by CPU time (less sensitive to other load on the machine): fast {cpu_speed['fast']:.1f}, "
        f"exact {cpu_speed['exact']:.1f} simulated min per CPU second"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
