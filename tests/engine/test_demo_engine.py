"""demo/real_engine.py: which engine the demo runs (PREFIXOPS_DEMO_ENGINE, DEMO_ENGINE as fallback)."""

from __future__ import annotations

import pytest

from demo.real_engine import DemoEngineError, demo_engine_from_env


@pytest.mark.parametrize(
    "environ,expected",
    [
        ({}, "sim"),
        ({"DEMO_ENGINE": "vllm"}, "vllm"),
        ({"PREFIXOPS_DEMO_ENGINE": "vllm", "DEMO_ENGINE": "sim"}, "vllm"),
        ({"PREFIXOPS_DEMO_ENGINE": "simulator"}, "sim"),
        ({"PREFIXOPS_DEMO_ENGINE": " VLLM "}, "vllm"),
    ],
)
def test_demo_engine_from_env(environ, expected):
    assert demo_engine_from_env(environ) == expected


def test_an_unknown_demo_engine_is_named():
    with pytest.raises(DemoEngineError, match="got 'sglang'"):
        demo_engine_from_env({"DEMO_ENGINE": "sglang"})


def test_the_real_engine_demo_runs_steady_in_wall_clock_time(monkeypatch):
    from demo.__main__ import parse_args

    monkeypatch.setenv("PREFIXOPS_DEMO_ENGINE", "vllm")
    args = parse_args([])
    assert (args.engine, args.speed, args.scenario) == ("vllm", 1.0, "steady")
    with pytest.raises(SystemExit):
        parse_args(["--scenario", "collapse"])
