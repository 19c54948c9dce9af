"""The SQL layout of the blob store: one header row per blob, its bytes in ordered chunk rows."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import mysql

__all__ = [
    "BLOB_TABLE",
    "CHUNK_TABLE",
    "SCHEDULE_CHANGE_TABLE",
    "SCHEDULE_OVERRIDE_TABLE",
    "VERSION_TABLE",
    "blob_table",
    "chunk_table",
    "metadata",
    "schedule_change_table",
    "schedule_override_table",
]

BLOB_TABLE = "agent_async_blob"
SCHEDULE_OVERRIDE_TABLE = "agent_async_schedule_override"
SCHEDULE_CHANGE_TABLE = "agent_async_schedule_change"
CHUNK_TABLE = "agent_async_blob_chunk"
# Alembic's bookkeeping table, named apart from `alembic_version` so an application's own Alembic
# environment can share the database.
VERSION_TABLE = "agent_async_alembic_version"

KEY_CHARS = 32
SHA256_HEX_CHARS = 64
SOURCE_CHARS = 64
CONTENT_TYPE_CHARS = 255

# MySQL's plain BLOB stops at 64 KiB; LONGBLOB keeps any chunk size the settings allow.
CHUNK_BYTES_TYPE = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")

metadata = MetaData()

blob_table = Table(
    BLOB_TABLE,
    metadata,
    Column("blob_key", String(KEY_CHARS), primary_key=True),
    Column("source", String(SOURCE_CHARS), nullable=False),
    Column("content_type", String(CONTENT_TYPE_CHARS), nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("sha256", String(SHA256_HEX_CHARS), nullable=False),
    Column("chunk_count", Integer, nullable=False),
    # Epoch milliseconds (UTC), written by the client: integer comparison behaves the same on all
    # three databases, unlike their DATETIME/TIMESTAMP time-zone rules.
    Column("created_at_ms", BigInteger, nullable=False),
    Index("ix_agent_async_blob_source_created", "source", "created_at_ms"),
)

chunk_table = Table(
    CHUNK_TABLE,
    metadata,
    Column(
        "blob_key",
        String(KEY_CHARS),
        ForeignKey(f"{BLOB_TABLE}.blob_key", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("sha256", String(SHA256_HEX_CHARS), nullable=False),
    Column("data", CHUNK_BYTES_TYPE, nullable=False),
)

NAMESPACE_CHARS = 64
SCHEDULE_NAME_CHARS = 255
CRON_CHARS = 255
ACTOR_CHARS = 255

# Runtime overrides of the schedules declared on JobRequests (name = the job name).
schedule_override_table = Table(
    SCHEDULE_OVERRIDE_TABLE,
    metadata,
    # The deployment's AGENT_NAMESPACE: two deployments may share one database.
    Column("namespace", String(NAMESPACE_CHARS), primary_key=True),
    Column("schedule_name", String(SCHEDULE_NAME_CHARS), primary_key=True),
    Column("enabled", Boolean, nullable=False),
    # NULL: the request's own cron applies.
    Column("cron", String(CRON_CHARS), nullable=True),
    Column("updated_at_ms", BigInteger, nullable=False),
    Column("updated_by", String(ACTOR_CHARS), nullable=False),
)

# Every change made to an override: who, when, what (a JSON object of the changed fields).
schedule_change_table = Table(
    SCHEDULE_CHANGE_TABLE,
    metadata,
    Column("change_id", Integer, primary_key=True, autoincrement=True),
    Column("namespace", String(NAMESPACE_CHARS), nullable=False),
    Column("schedule_name", String(SCHEDULE_NAME_CHARS), nullable=False),
    Column("changed_at_ms", BigInteger, nullable=False),
    Column("changed_by", String(ACTOR_CHARS), nullable=False),
    Column("change", Text, nullable=False),
    Index("ix_agent_async_schedule_change_name", "namespace", "schedule_name", "changed_at_ms"),
)
