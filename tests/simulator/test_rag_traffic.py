"""The live RAG traffic of the rag-storm preset (``loadgen --rag-preset``): through a real sidecar, its storm puts
the sidecar in the thin-reuse regime and its compaction job's requests reach the gate; the regime is left after
the storm."""

from __future__ import annotations

import subprocess
import time

import httpx

from simulator.rag_traffic import rag_preset
from tests.support import PYTHON, REPO, simulator_and_sidecar


def test_rag_preset_is_the_offline_scenario_with_overrides() -> None:
    from simulator.offline import scenario_config

    assert rag_preset([]) == scenario_config("rag-storm").rag
    assert rag_preset(["storm_minutes=2"]).storm_minutes == 2.0


def test_a_bad_rag_set_fails_naming_the_key() -> None:
    out = subprocess.run(
        [PYTHON, "-m", "simulator", "loadgen", "--rag-preset", "--rag-set", "no_such=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "no_such" in out.stderr


def test_storm_enters_thin_reuse_and_the_compaction_job_asks_the_gate(tmp_path) -> None:
    speed = 4
    # the preset (the demo's speed), its storm from simulated minute 0.5 for 1.5 minutes: wall seconds 7.5..30;
    # the sidecar's reuse window is 15 s
    with simulator_and_sidecar(
        tmp_path, engine_args=("--speed", str(speed)), sidecar_args=("--window-s", "15")
    ) as (_engine, sidecar):
        log = (tmp_path / "loadgen.log").open("w")
        loadgen = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "simulator",
                "loadgen",
                "--target",
                sidecar,
                "--speed",
                str(speed),
                "--sessions-per-s",
                "0",
                "--rag-preset",
                "--rag-set",
                "storm_start_min=0.5",
                "--rag-set",
                "storm_minutes=1.5",
                "--rag-set",
                "compaction_every=150",  # the storm is 1.5 minutes, not 10: the job's N scaled alike
                "--duration",
                "100",
                "--seed",
                "3",
            ],
            cwd=REPO,
            stdout=log,
            stderr=log,
            text=True,
        )
        regimes: list[tuple[float, str, float | None]] = []
        t0 = time.monotonic()
        while loadgen.poll() is None and time.monotonic() - t0 < 100 + 40:
            reuse = httpx.get(f"{sidecar}/state", timeout=5).json()["reuse"]
            regimes.append((time.monotonic() - t0, reuse["regime"], reuse["divergence"]))
            time.sleep(0.5)
        stopped = loadgen.poll() is not None
        if not stopped:
            loadgen.kill()
        loadgen.wait(timeout=30)
        log.close()
        err = (tmp_path / "loadgen.log").read_text()
        decisions = httpx.get(f"{sidecar}/compaction/decisions", timeout=5).json()
    timeline = [(round(t), r, d and round(d, 2)) for t, r, d in regimes]
    assert stopped, "the load generator did not stop at --duration (a starved arrival loop must still yield)"
    assert loadgen.returncode == 0 and "Traceback" not in err, err[-2000:]
    # entered during the storm (its requests complete late on a loaded machine, so no fixed times) ...
    thin = [t for t, r, _ in regimes if r == "thin-reuse"]
    assert thin and min(thin) >= 7, timeline
    # ... and left after it, while the document traffic goes on
    assert regimes[-1][1] == "normal" and any(r == "normal" and t > max(thin) for t, r, _ in regimes), (
        timeline
    )
    assert decisions, "the compaction job's requests reached the gate"
    assert {d["subtree_id"] for d in decisions} <= {f"rag-docs-{n}" for n in range(8)}
    assert any(d["decision"] == "deferred" and d["regime"] == "thin-reuse" for d in decisions), decisions[:5]
    assert "compactions granted" in err
