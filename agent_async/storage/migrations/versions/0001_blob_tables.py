"""Blob header and chunk tables.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copy of the layout at this revision: later edits to schema.py must come as new revisions.
_CHUNK_DATA = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "agent_async_blob",
        sa.Column("blob_key", sa.String(32), primary_key=True),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("content_type", sa.String(255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("chunk_count", sa.Integer(), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
    )
    op.create_index(
        "ix_agent_async_blob_source_created", "agent_async_blob", ["source", "created_at_ms"]
    )
    op.create_table(
        "agent_async_blob_chunk",
        sa.Column(
            "blob_key",
            sa.String(32),
            sa.ForeignKey("agent_async_blob.blob_key", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("data", _CHUNK_DATA, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("agent_async_blob_chunk")
    op.drop_index("ix_agent_async_blob_source_created", table_name="agent_async_blob")
    op.drop_table("agent_async_blob")
