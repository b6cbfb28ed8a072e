"""Fixtures shared across the suite."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

from tests import support, xdist_groups
from tests.db.pg import fresh_database, postgres_server

# Property tests check results, not speed: a per-example deadline only measures the machine's load
# (it failed tests/core/test_runs.py once under a loaded `-n 2` run).
settings.register_profile("prefixops", deadline=None)
settings.load_profile("prefixops")


def _starts_processes(module: ModuleType) -> bool:
    """A test module that starts real processes: it uses `support.running` or `subprocess`, or a
    fixture or helper of another test module that does."""
    for value in vars(module).values():
        if value is support.running or value is subprocess:
            return True
        owner = sys.modules.get(getattr(value, "__module__", None) or "")
        if (
            owner is not None
            and owner is not module
            and owner.__name__.startswith("tests.")
            and owner is not support
            and getattr(owner, "running", None) is support.running
        ):
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    # xdist_group marks keep their tests on one worker again under pytest 9.2 (see tests/xdist_groups.py)
    if not config.pluginmanager.is_registered(xdist_groups):
        config.pluginmanager.register(xdist_groups, "prefixops-xdist-groups")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of a process-starting module `process`, so `make test-fast` can leave them out."""
    seen: dict[str, bool] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        if module.__name__ not in seen:
            seen[module.__name__] = _starts_processes(module)
        if seen[module.__name__]:
            item.add_marker(pytest.mark.process)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """One throwaway PostgreSQL cluster on loopback per test process (see tests/db/pg.py)."""
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: SQLite in a temp dir, and PostgreSQL on loopback."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'prefixops.db'}"
    return fresh_database(request.getfixturevalue("postgres_server_url"))
