"""Run records.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Frozen copies of the layout at this revision (agent_async/runs/tables.py): later edits come as new revisions.
_JSON_TEXT = sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
_MESSAGE_TEXT = sa.Text().with_variant(mysql.TEXT(charset="utf8mb4"), "mysql", "mariadb")


def _identifier(chars: int) -> sa.types.TypeEngine[str]:
    # Any Unicode, compared byte for byte on MariaDB, whose default collations ignore case.
    return sa.String(chars).with_variant(
        mysql.VARCHAR(chars, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def upgrade() -> None:
    op.create_table(
        "agent_async_run",
        sa.Column("run_id", sa.String(32), primary_key=True),
        sa.Column("namespace", _identifier(64), nullable=False),
        sa.Column("kind", _identifier(255), nullable=False),
        sa.Column("triggered_by", sa.String(16), nullable=False),
        sa.Column("user_uid", _identifier(255), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("counters", _JSON_TEXT, nullable=False),
        sa.Column("error", _MESSAGE_TEXT, nullable=True),
        sa.Column("failed_ids", _JSON_TEXT, nullable=False),
        sa.Column("job_id", _identifier(255), nullable=True),
        sa.Column("group_id", _identifier(255), nullable=True),
        sa.Column("started_ms", sa.BigInteger(), nullable=False),
        sa.Column("finished_ms", sa.BigInteger(), nullable=True),
        sa.Column("heartbeat_ms", sa.BigInteger(), nullable=False),
    )
    op.create_index(
        "ix_agent_async_run_kind_started", "agent_async_run", ["namespace", "kind", "started_ms", "run_id"]
    )
    op.create_index("ix_agent_async_run_started", "agent_async_run", ["namespace", "started_ms", "run_id"])
    op.create_index(
        "ix_agent_async_run_user_started", "agent_async_run", ["namespace", "user_uid", "started_ms", "run_id"]
    )
    op.create_index("ix_agent_async_run_status", "agent_async_run", ["namespace", "status", "started_ms", "run_id"])


def downgrade() -> None:
    op.drop_index("ix_agent_async_run_status", table_name="agent_async_run")
    op.drop_index("ix_agent_async_run_user_started", table_name="agent_async_run")
    op.drop_index("ix_agent_async_run_started", table_name="agent_async_run")
    op.drop_index("ix_agent_async_run_kind_started", table_name="agent_async_run")
    op.drop_table("agent_async_run")
