"""Fixtures for the dashboard's AppTests: a filled database per test (copied from one template)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboard.fill import fill_database
from tests.support import REPO

APP = str(REPO / "app.py")
PASSPHRASE = "correct horse battery staple"  # the password of every account below
ACCOUNTS = {"alice": "operator", "vera": "viewer", "ada": "admin"}


@pytest.fixture(scope="session")
def filled_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    from db import make_engine

    path = tmp_path_factory.mktemp("filled") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    now = fill_database(engine, time.time())
    from db.accounts import add_account

    for name, role in ACCOUNTS.items():
        add_account(engine, name, role, PASSPHRASE, actor="fixture", method="cli", now=now - 3600)
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    return path, now


@pytest.fixture
def db_url(filled_template: tuple[Path, float], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A private copy of the filled database, wired into the app's environment."""
    src, _now = filled_template
    dst = tmp_path / "prefixops.db"
    shutil.copyfile(src, dst)
    url = f"sqlite:///{dst}"
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("PREFIXOPS_OPERATOR_TOKEN", "test-operator-token")
    # Freshness is judged against the fill time; keep it "fresh" however slow the machine is.
    monkeypatch.setenv("PREFIXOPS_STALE_SECONDS", "3600")
    monkeypatch.setenv("PREFIXOPS_HEARTBEAT_STALE_SECONDS", "3600")
    for name in ("PREFIXOPS_CONFIG", "PREFIXOPS_OPERATOR_ALLOWLIST"):
        monkeypatch.delenv(name, raising=False)
    return url


@pytest.fixture
def fill_now(filled_template: tuple[Path, float]) -> float:
    return filled_template[1]


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    """No test sees another's fake sidecar transport (it lives for the process)."""
    from dashboard import data

    yield
    data.transport_override = None
