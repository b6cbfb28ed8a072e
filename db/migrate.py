"""Schema migrations: `upgrade(engine)` brings any database (new or old) to the newest schema.

Alembic revisions live in db/migrations/versions. A database created before
migrations existed (tables present, no ``alembic_version``) is stamped at the
first revision, then upgraded, so its history is kept.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
FIRST_REVISION = "0001"
# For databases created without Alembic (tables present, no alembic_version): the newest
# revision whose table (and column, when one is named) exists is the one they are at.
REVISION_MARKERS: tuple[tuple[str, str, str | None], ...] = (
    ("0005_turns", "turns", None),
    ("0004", "accounts", None),
    ("0003_epochs", "audit", "epoch"),
    ("0002", "rollups_10m", None),
    ("0001", "targets", None),
)


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Create or migrate the schema of `engine`'s database to `revision` (default: newest)."""
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        inspector = inspect(conn)
        tables = set(inspector.get_table_names())
        if "targets" in tables and "alembic_version" not in tables:
            revision_now = next(
                rev
                for rev, table, column in REVISION_MARKERS
                if table in tables
                and (column is None or column in {c["name"] for c in inspector.get_columns(table)})
            )
            log.info("database has tables but no migration record: stamping revision %s", revision_now)
            command.stamp(config, revision_now)
        command.upgrade(config, revision)
