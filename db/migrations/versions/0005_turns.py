"""turns: the sidecars' turn trace (issue 16 item 1)

One row per turn read from a sidecar's GET /turns, keyed by (target, log epoch, remote id) like
the audit and decision logs; indexed by time and by (session, time). No prompt content.

Revision ID: 0005_turns
Revises: 0004
Create Date: 2026-12-01 14:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_turns"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "turns",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), server_default="0", nullable=False),
        sa.Column("remote_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("session_id", sa.String(length=256), nullable=True),
        sa.Column("subtree_id", sa.String(length=256), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("held_s", sa.Double(), nullable=True),
        sa.Column("parked_s", sa.Double(), nullable=True),
        sa.Column("latency_s", sa.Double(), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"], name=op.f("fk_turns_target_id_targets"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turns")),
        sa.UniqueConstraint("target_id", "epoch", "remote_id", name=op.f("uq_turns_target_id")),
    )
    op.create_index(op.f("ix_turns_ts"), "turns", ["ts"], unique=False)
    op.create_index(op.f("ix_turns_session_id"), "turns", ["session_id", "ts"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_turns_session_id"), table_name="turns")
    op.drop_index(op.f("ix_turns_ts"), table_name="turns")
    op.drop_table("turns")
