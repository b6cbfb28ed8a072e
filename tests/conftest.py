"""Fixtures shared across the suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.db.pg import fresh_database, postgres_server


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
