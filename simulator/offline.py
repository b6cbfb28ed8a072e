"""Offline runs: the scenario registry and ``run_scenario``, the one entry point of every offline run.

A scenario is a named preset of the workload (a function of the base
``SimConfig``) and the model that runs it: ``agent`` (closed-loop agent sessions
behind the sidecar's budgeter, ``simulator.agent``) or ``rag`` (open-loop
retrieval traffic with a compaction job, ``simulator.rag``). Both models run on
the one event loop of ``simulator.loop``. ``--set`` overrides apply after the
preset. A run is pure: it returns plain data (series and a summary); plots and
the experiment harnesses that repeat runs over seeds live in
``simulator.plots``, ``simulator.experiments`` and ``simulator.compaction_experiment``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from simulator.agent import CONTROLS, run_agent
from simulator.config import SimConfig, SimConfigError, apply_overrides
from simulator.rag import run_rag
from simulator.truth import Watch

__all__ = ["CONTROLS", "SCENARIOS", "Scenario", "run_scenario", "scenario", "scenario_config"]


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str  # "agent" | "rag"
    preset: Callable[[SimConfig], SimConfig]
    description: str


def _agent(**changes: Any) -> Callable[[SimConfig], SimConfig]:
    return lambda cfg: replace(cfg, agent=replace(cfg.agent, **changes))


_REGISTRY: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("agent-steady", "agent", _agent(burst_rate=0.0), "Poisson agent sessions, no burst"),
        # 30 extra sessions over 5 minutes (SIMULATOR.md's prototype: ~15, Poisson); see docs/simulator-results.md
        Scenario(
            "agent-burst",
            "agent",
            _agent(burst_rate=0.1),
            "agent-steady plus a burst of 30 sessions at minute 5",
        ),
        Scenario(
            "agent-flush",
            "agent",
            _agent(burst_rate=0.0, flush_at_min=10.0),
            "agent-steady with a prefix-cache flush (and preemption) at minute 10",
        ),
        Scenario(
            "rag-storm",
            "rag",
            lambda cfg: cfg,
            "retrieval traffic over document sets, a storm of heterogeneous retrievals, a compaction job",
        ),
    )
}
SCENARIOS = tuple(_REGISTRY)
_MODELS: dict[str, Callable[..., dict[str, Any]]] = {
    "agent": lambda cfg, control, seed, minutes, watch: run_agent(cfg, control, seed, minutes, watch),
    "rag": lambda cfg, control, seed, minutes, watch: run_rag(cfg, seed, minutes, watch),
}


def scenario(name: str) -> Scenario:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SimConfigError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None


def scenario_config(name: str, base: SimConfig | None = None) -> SimConfig:
    """The preset of scenario ``name`` (``--set`` overrides are applied after)."""
    return scenario(name).preset(base or SimConfig())


def run_scenario(
    name: str,
    control: str,
    seed: int,
    minutes: float,
    overrides: dict[str, Any] | None = None,
    exact: bool = False,
    watch: Watch | None = None,
) -> dict[str, Any]:
    """One offline run; returns ``{"scenario", "control", "seed", "minutes", "mode", "config", "series", "summary"}``.

    ``control`` is the budgeter's mode for the agent model; the RAG model has no budgeter and ignores it.
    ``watch`` (``simulator.truth``) records the turn trace and why each missing block was missing.
    """
    sc = scenario(name)
    cfg = apply_overrides(sc.preset(SimConfig()), dict(overrides or {}))
    if exact:
        cfg = replace(cfg, engine=replace(cfg.engine, mode="exact"))
    result = _MODELS[sc.model](cfg, control, seed, minutes, watch)
    return {
        "scenario": name,
        "control": control,
        "seed": seed,
        "minutes": minutes,
        "mode": cfg.engine.mode,
        "config": cfg.to_dict(),
        **result,
    }
