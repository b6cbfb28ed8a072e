"""sidecar log epochs: audit and compaction decisions keyed by (target, epoch, remote id)

A sidecar whose state db is wiped numbers its audit entries and compaction decisions from 1
again. The collectors store its new entries under the next epoch instead of skipping them as
already seen. Existing rows are epoch 0.

Revision ID: 0003_epochs
Revises: 0002
Create Date: 2026-12-01 13:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_epochs"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLES = ("audit", "compaction_decisions")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("epoch", sa.Integer(), server_default="0", nullable=False))
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(f"uq_{table}_target_id", type_="unique")
            batch_op.create_unique_constraint(f"uq_{table}_target_id", ["target_id", "epoch", "remote_id"])


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(f"uq_{table}_target_id", type_="unique")
            batch_op.create_unique_constraint(f"uq_{table}_target_id", ["target_id", "remote_id"])
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("epoch")
