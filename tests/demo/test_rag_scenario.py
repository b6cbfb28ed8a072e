"""`python -m demo --scenario rag`: the load generator gets the offline rag-storm preset, its storm repeating,
and no agent sessions; the scenario keeps its own data directory. (The preset through a real sidecar is
tests/simulator/test_rag_traffic.py.)"""

from pathlib import Path

from demo.__main__ import parse_args
from demo.scenarios import loadgen_args, scenario_note
from demo.services import REPO
from demo.stack import build_services
from simulator.offline import scenario_config


def test_rag_scenario_runs_the_rag_storm_preset_with_its_storm_repeating() -> None:
    r = scenario_config("rag-storm").rag
    args = loadgen_args("rag", 4.0)
    assert "--rag-preset" in args
    assert args[args.index("--sessions-per-s") + 1] == "0"
    # storm at minute 10 for 10 minutes at x4: on from 150 s to 300 s, again every 450 s
    assert (
        float(args[args.index("--rag-storm-every") + 1]) == (2 * r.storm_start_min + r.storm_minutes) * 60 / 4
    )


def test_rag_scenario_defaults() -> None:
    args = parse_args(["--scenario", "rag"])
    assert args.speed == 4.0
    assert args.data_dir == (REPO / "data" / "rag").resolve()
    note = " ".join(scenario_note(args).split())
    assert "starts in about 150 s and lasts 150 s" in note and "every 450 s" in note
    assert parse_args(["--scenario", "steady"]).data_dir == (REPO / "data").resolve()


def test_rag_scenario_sidecar_judges_the_presets_windows_in_engine_time(tmp_path: Path) -> None:
    """The offline run judges the regime over reuse_window_s and warmth over warmth_window_s of engine time;
    at x4 the demo's sidecar gets a quarter of each in wall seconds (the steady scenario keeps its defaults)."""
    r = scenario_config("rag-storm").rag
    args = parse_args(["--scenario", "rag", "--data-dir", str(tmp_path)])
    sidecar = next(s for s in build_services(args, "token") if s.name == "sidecar").cmd
    assert float(sidecar[sidecar.index("--window-s") + 1]) == r.reuse_window_s / 4
    assert float(sidecar[sidecar.index("--warmth-window") + 1]) == r.warmth_window_s / 4
    steady = parse_args(["--scenario", "steady", "--data-dir", str(tmp_path)])
    steady_sidecar = next(s for s in build_services(steady, "token") if s.name == "sidecar").cmd
    assert "--window-s" not in steady_sidecar and "--warmth-window" not in steady_sidecar
