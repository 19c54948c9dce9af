"""External ICS calendar subscriptions: one row per subscribed calendar.

Revision ID: app_0002
Revises: app_0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "app_0002"
down_revision = "app_0001"
branch_labels = None
depends_on = None


# Frozen copy of the layout at this revision: later edits to tables.py must come as new revisions.
def upgrade() -> None:
    op.create_table(
        "calendar_external_sources",
        sa.Column("calendar_key", sa.String(32), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("sync_interval_minutes", sa.Integer(), server_default=sa.text("60"), nullable=False),
        sa.Column("last_sync_at", sa.DateTime(), nullable=True),
        sa.Column("last_status", sa.String(16), nullable=True),
        sa.Column("last_error", sa.String(1024), nullable=True),
        sa.Column("etag", sa.String(1024), nullable=True),
        sa.Column("last_modified", sa.String(1024), nullable=True),
        sa.ForeignKeyConstraint(
            ["calendar_key"], ["calendars.key"],
            name="fk_calendar_external_sources_calendar_key_calendars", ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("calendar_key", name="pk_calendar_external_sources"),
    )


def downgrade() -> None:
    op.drop_table("calendar_external_sources")
