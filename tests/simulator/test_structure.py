"""The simulator's shape (issue 10 item 5): no import cycle between its modules, none over 500 lines but the pool,
one event loop, plots and harnesses out of the model code, policy defaults from core, serve's flags honest."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from core.budgeter import BudgeterConfig
from core.compaction import WarmthConfig
from core.reuse import RegimeConfig
from simulator.__main__ import build_parser
from simulator.config import SimConfig, SimConfigError
from simulator.serve_cli import serve_config
from tests.support import REPO

PKG = REPO / "simulator"


def imports_of(path: Path) -> set[str]:
    """Every ``simulator.*`` module imported anywhere in the file (function-level imports count)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("simulator"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("simulator")}
    return found


def graph() -> dict[str, set[str]]:
    mods = {f"simulator.{p.stem}" if p.stem != "__init__" else "simulator": p for p in PKG.glob("*.py")}
    return {m: {i for i in imports_of(p) if i in mods and i != m} for m, p in mods.items()}


def test_no_import_cycle_between_simulator_modules() -> None:
    g = graph()
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(g[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, m, n]))
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])


def test_no_module_over_500_lines_but_the_pool() -> None:
    long = {p.name: n for p in PKG.glob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert set(long) <= {"pool.py"}, long


def test_model_code_imports_no_plots_and_no_harness() -> None:
    g = graph()
    for model in ("simulator.agent", "simulator.rag", "simulator.loop", "simulator.offline"):
        assert not g[model] & {
            "simulator.plots",
            "simulator.experiments",
            "simulator.compaction_experiment",
        }, model
    # one event loop: the models use simulator.loop and keep no heap of their own
    for model in ("agent", "rag"):
        assert "simulator.loop" in g[f"simulator.{model}"]
        assert "heapq" not in (PKG / f"{model}.py").read_text()


def test_policy_defaults_come_from_core() -> None:
    cfg, budgeter, regime = SimConfig(), BudgeterConfig(), RegimeConfig()
    assert (cfg.control.low_band, cfg.control.high_band) == (budgeter.low, budgeter.high)
    assert (cfg.rag.divergence_enter, cfg.rag.divergence_exit, cfg.rag.regime_min_turns) == (
        regime.enter,
        regime.exit,
        regime.min_turns,
    )
    warmth = WarmthConfig()
    assert (cfg.rag.warmth_window_s, cfg.rag.warmth_floor) == (warmth.window_s, warmth.floor)
    for path in ("config.py", "agent.py", "rag.py"):
        text = (PKG / path).read_text()
        assert "= 0.75" not in text and "= 0.95" not in text and "enter: float = 0.5" not in text, path


def serve_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_serve_honours_set_for_pool_block_size_and_mode() -> None:
    engine = serve_config(
        serve_args("--set", "pool_tokens=123456", "--set", "block_size=32", "--set", "mode=exact")
    ).engine
    assert (engine.pool_tokens, engine.block_size, engine.mode) == (123456, 32, "exact")
    engine = serve_config(serve_args("--pool-tokens", "200000", "--mode", "exact")).engine
    assert (engine.pool_tokens, engine.block_size, engine.mode) == (200000, 16, "exact")
    assert serve_config(serve_args()).engine == SimConfig().engine
    # the same value twice is fine
    assert (
        serve_config(serve_args("--pool-tokens", "200000", "--set", "pool_tokens=2e5")).engine.pool_tokens
        == 200000
    )


def test_serve_flag_and_set_that_disagree_fail_naming_both() -> None:
    with pytest.raises(SimConfigError, match=r"--pool-tokens 200000 and --set pool_tokens=300000 disagree"):
        serve_config(serve_args("--pool-tokens", "200000", "--set", "pool_tokens=300000"))
    with pytest.raises(SimConfigError, match=r"--mode fast and --set mode=exact disagree"):
        serve_config(serve_args("--mode", "fast", "--set", "mode=exact"))


def test_one_filler_text_generator() -> None:
    from simulator import content, loadgen, server

    assert loadgen.filler is content.filler
    assert server.answer_text(5, b"x") == content.filler(__import__("random").Random(b"x"), 5)
    for path in PKG.glob("*.py"):
        assert path.name == "content.py" or "WORDS = (" not in path.read_text(), path.name
