"""`python -m demo --scenario rag`: the load generator gets the offline rag-storm preset, its storm repeating,
and no agent sessions; the scenario keeps its own data directory. (The preset through a real sidecar is
tests/simulator/test_rag_traffic.py.)"""

from demo.__main__ import parse_args
from demo.scenarios import loadgen_args, scenario_note
from demo.services import REPO
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
