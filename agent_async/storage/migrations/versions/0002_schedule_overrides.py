"""Schedule overrides and their change log.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_async_schedule_override",
        sa.Column("namespace", sa.String(64), primary_key=True),
        sa.Column("schedule_name", sa.String(255), primary_key=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("cron", sa.String(255), nullable=True),
        sa.Column("updated_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=False),
    )
    op.create_table(
        "agent_async_schedule_change",
        sa.Column("change_id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(64), nullable=False),
        sa.Column("schedule_name", sa.String(255), nullable=False),
        sa.Column("changed_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("changed_by", sa.String(255), nullable=False),
        sa.Column("change", sa.Text(), nullable=False),
    )
    op.create_index(
        "ix_agent_async_schedule_change_name",
        "agent_async_schedule_change",
        ["namespace", "schedule_name", "changed_at_ms"],
    )


def downgrade() -> None:
    op.drop_index("ix_agent_async_schedule_change_name", table_name="agent_async_schedule_change")
    op.drop_table("agent_async_schedule_change")
    op.drop_table("agent_async_schedule_override")
