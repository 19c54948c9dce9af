"""External calendars: next_sync_at (last_sync_at + the interval), indexed, for the sweep's due query.

Revision ID: app_0003
Revises: app_0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from alembic import op

revision = "app_0003"
down_revision = "app_0002"
branch_labels = None
depends_on = None

_SOURCES = sa.table(
    "calendar_external_sources",
    sa.column("calendar_key", sa.String(32)),
    sa.column("sync_interval_minutes", sa.Integer()),
    sa.column("last_sync_at", sa.DateTime()),
    sa.column("next_sync_at", sa.DateTime()),
)


def upgrade() -> None:
    op.add_column("calendar_external_sources", sa.Column("next_sync_at", sa.DateTime(), nullable=True))
    op.create_index(
        "ix_calendar_external_sources_next_sync_at", "calendar_external_sources", ["next_sync_at"]
    )
    # Backfilled in Python: date arithmetic in SQL is written differently on every database.
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(_SOURCES.c.calendar_key, _SOURCES.c.sync_interval_minutes, _SOURCES.c.last_sync_at)
        .where(_SOURCES.c.last_sync_at.is_not(None))
    ).all()
    for key, minutes, last in rows:
        bind.execute(
            sa.update(_SOURCES).where(_SOURCES.c.calendar_key == key)
            .values(next_sync_at=last + timedelta(minutes=minutes))
        )


def downgrade() -> None:
    op.drop_index("ix_calendar_external_sources_next_sync_at", table_name="calendar_external_sources")
    op.drop_column("calendar_external_sources", "next_sync_at")
