"""SQL tables of the calendar module."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, ForeignKey, Integer, String, Table, Text, UniqueConstraint

from app.db import metadata

__all__ = ["DESCRIPTION_CHARS", "KEY_CHARS", "SUMMARY_CHARS", "UID_CHARS", "calendars", "events"]

KEY_CHARS = 32
OWNER_CHARS = 255
NAME_CHARS = 255
UID_CHARS = 255
SUMMARY_CHARS = 1024
# Not a column limit: MariaDB's TEXT holds 65 535 bytes, and 10 000 characters of up to 4 bytes fit,
# so a description this long is stored by all three databases (the API and the import enforce it).
DESCRIPTION_CHARS = 10_000

calendars = Table(
    "calendars",
    metadata,
    Column("key", String(KEY_CHARS), primary_key=True),
    Column("owner_uid", String(OWNER_CHARS), nullable=False, index=True),
    Column("name", String(NAME_CHARS), nullable=False),
    Column("created_at", DateTime, nullable=False),
)

events = Table(
    "calendar_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "calendar_key",
        String(KEY_CHARS),
        ForeignKey("calendars.key", ondelete="CASCADE"),
        nullable=False,
    ),
    # The ICS UID: imports upsert by it, so re-importing a file never duplicates an event.
    Column("uid", String(UID_CHARS), nullable=False),
    Column("summary", String(SUMMARY_CHARS), nullable=False),
    Column("start_at", DateTime, nullable=False),
    Column("end_at", DateTime, nullable=False),
    Column("description", Text, nullable=True),
    UniqueConstraint("calendar_key", "uid"),
)
