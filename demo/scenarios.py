"""The demo's scenarios (``--scenario steady|collapse|rag``): the load generator's arguments, the collapse
scenario's time-scaled alert windows, and the note the banner prints for each (see ``demo.__main__``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.config import AgentWorkload


def collapse_alert_table(speed: float) -> str:
    """The collapse rule's windows in wall seconds, scaled by the simulator's speed.

    The rule judges its windows (core.alerts.AlertSettings: 5 minutes against a 30-minute baseline)
    in the engine's own time; at speed x10 those are 30 s and 3 min of wall time, so the alert fires
    as it would on a real engine.
    """
    from core.alerts import AlertSettings

    d = AlertSettings()
    return f"""
# Time-scaled for the simulator's speed x{speed:g}: the collapse rule's windows are in engine time.
[alerts]
collapse_window_s = {d.collapse_window_s / speed:g}
collapse_baseline_s = {d.collapse_baseline_s / speed:g}
collapse_for_s = {max(2.0, d.collapse_for_s / speed):g}
collapse_clear_s = {max(3.0, d.collapse_clear_s / speed):g}
collapse_eval_every_s = {max(1.0, d.collapse_eval_every_s / speed):g}
"""


SCENARIOS = ("steady", "collapse", "rag")
DEFAULT_SPEED = {"steady": 4.0, "collapse": 10.0, "rag": 4.0}


def burst_preset() -> AgentWorkload:
    """The offline ``agent-burst`` scenario's workload (simulator/offline.py), which the collapse scenario runs live."""
    from simulator.offline import scenario_config

    return scenario_config("agent-burst").agent


def loadgen_args(scenario: str, speed: float) -> list[str]:
    """The load generator's arguments for ``scenario`` (arrival rates are per wall second)."""
    if scenario == "steady":
        return []
    if scenario == "rag":
        return rag_loadgen_args(speed)
    a = burst_preset()
    return [
        "--sessions-per-s",
        f"{a.arrival_rate * speed:g}",
        "--max-sessions",
        "10000",
        "--turns",
        str(a.turns),
        "--initial-context",
        str(a.initial_context),
        "--context-growth",
        str(a.context_growth),
        "--output-tokens",
        str(a.output_tokens),
        "--tool-latency",
        f"{a.tool_latency_mean:g}",
        "--burst-at",
        f"{a.burst_start_min * 60 / speed:g}",
        "--burst-seconds",
        f"{a.burst_minutes * 60 / speed:g}",
        "--burst-rate",
        f"{a.burst_rate * speed:g}",
    ]


def rag_loadgen_args(speed: float) -> list[str]:
    """The rag scenario: the rag-storm preset (simulator/rag_traffic.py); the storm comes back after twice its lead."""
    from simulator.offline import scenario_config

    r = scenario_config("rag-storm").rag
    every = (2 * r.storm_start_min + r.storm_minutes) * 60 / speed
    return ["--sessions-per-s", "0", "--rag-preset", "--rag-storm-every", f"{every:g}"]


def rag_sidecar_args(speed: float) -> list[str]:
    """The rag scenario's sidecar judges the preset's windows (reuse, warmth) in engine time, as the offline run does."""
    from simulator.offline import scenario_config

    r = scenario_config("rag-storm").rag
    return [
        "--window-s",
        f"{r.reuse_window_s / speed:g}",
        "--warmth-window",
        f"{r.warmth_window_s / speed:g}",
    ]


def scenario_note(args: argparse.Namespace) -> str:
    if args.scenario == "steady":
        return "Demo traffic is flowing through the sidecar. "
    if args.scenario == "rag":
        from simulator.offline import scenario_config

        r = scenario_config("rag-storm").rag
        start, length = r.storm_start_min * 60 / args.speed, r.storm_minutes * 60 / args.speed
        return f"""Scenario: rag. Retrieval traffic over {r.doc_sets} document sets, and a compaction job asking the
  sidecar's gate every {r.compaction_every} requests. A storm of heterogeneous retrievals starts in about
  {start:.0f} s and lasts {length:.0f} s (then again every {(2 * start + length):.0f} s): the Compaction page shows the
  thin-reuse regime (R_r stays ~0.9 while R_t falls to ~0.1) and the gate deferring the warm document sets,
  then the regime ending after the storm.
"""
    a = burst_preset()
    extra = round(a.burst_rate * a.burst_minutes * 60)
    return f"""Scenario: collapse. The sidecar's control mode is off. A burst of about {extra} extra agent sessions
  starts at simulated minute {a.burst_start_min:g} (in about {a.burst_start_min * 60 / args.speed:.0f} s) and the engine collapses a few simulated
  minutes later: on the Overview page the token-weighted hit rate falls to ~0.13 while the
  request-weighted one stays near 1.0, and the backlog keeps growing after the burst ends.
  Bring it back: sign in, open the Budgeter page and set the mode to budgeter-park (or
  PUT /control/budgeter {{"mode": "budgeter-park"}} on the sidecar with the token above).
"""
