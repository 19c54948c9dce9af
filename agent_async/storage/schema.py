"""The SQL layout of the blob store: one header row per blob, its bytes in ordered chunk rows.

`metadata` is the library's one SQLAlchemy MetaData: the schedules' tables
(agent_async.schedules.tables) join it, and the library's migrations cover both.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
)
from sqlalchemy.dialects import mysql

__all__ = [
    "BLOB_TABLE",
    "CHUNK_TABLE",
    "VERSION_TABLE",
    "blob_table",
    "chunk_table",
    "metadata",
]

BLOB_TABLE = "agent_async_blob"
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
