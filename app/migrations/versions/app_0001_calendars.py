"""Calendars and their events.

Revision ID: app_0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = None
depends_on = None


# Frozen copy of the layout at this revision: later edits to tables.py must come as new revisions.
def upgrade() -> None:
    op.create_table(
        "calendars",
        sa.Column("key", sa.String(32), nullable=False),
        sa.Column("owner_uid", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_calendars"),
    )
    op.create_index("ix_calendars_owner_uid", "calendars", ["owner_uid"])
    op.create_table(
        "calendar_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("calendar_key", sa.String(32), nullable=False),
        sa.Column("uid", sa.String(255), nullable=False),
        sa.Column("summary", sa.String(1024), nullable=False),
        sa.Column("start_at", sa.DateTime(), nullable=False),
        sa.Column("end_at", sa.DateTime(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["calendar_key"], ["calendars.key"],
            name="fk_calendar_events_calendar_key_calendars", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_calendar_events"),
        sa.UniqueConstraint("calendar_key", "uid", name="uq_calendar_events_calendar_key_uid"),
    )


def downgrade() -> None:
    op.drop_table("calendar_events")
    op.drop_index("ix_calendars_owner_uid", table_name="calendars")
    op.drop_table("calendars")
