"""The SQL tables of runtime schedule overrides and their change log (library migration 0002)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Index, Integer, String, Table, Text

from agent_async.storage.schema import metadata

__all__ = ["SCHEDULE_CHANGE_TABLE", "SCHEDULE_OVERRIDE_TABLE", "schedule_change_table", "schedule_override_table"]

SCHEDULE_OVERRIDE_TABLE = "agent_async_schedule_override"
SCHEDULE_CHANGE_TABLE = "agent_async_schedule_change"

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
