"""SQL tables of the calendar module."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, ForeignKey, Integer, String, Table, Text, UniqueConstraint, text

from app.db import metadata

__all__ = [
    "DESCRIPTION_CHARS", "KEY_CHARS", "SUMMARY_CHARS", "UID_CHARS", "URL_CHARS", "calendars", "events",
    "external_sources",
]

KEY_CHARS = 32
OWNER_CHARS = 255
NAME_CHARS = 255
UID_CHARS = 255
SUMMARY_CHARS = 1024
# Not a column limit: MariaDB's TEXT holds 65 535 bytes, and 10 000 characters of up to 4 bytes fit,
# so a description this long is stored by all three databases (the API and the import enforce it).
DESCRIPTION_CHARS = 10_000
# External calendars: the source URL, the validators the server sent, the last error shown to the owner.
URL_CHARS = 2048
VALIDATOR_CHARS = 1024
STATUS_CHARS = 16
ERROR_CHARS = 1024
DEFAULT_SYNC_INTERVAL_MINUTES = 60

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

# One row per external (subscribed) calendar: the calendar itself is a row of `calendars` like any
# other, so listing, events, export and delete work on it unchanged.
external_sources = Table(
    "calendar_external_sources",
    metadata,
    Column(
        "calendar_key",
        String(KEY_CHARS),
        ForeignKey("calendars.key", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("url", String(URL_CHARS), nullable=False),
    Column(
        "sync_interval_minutes", Integer, nullable=False,
        server_default=text(str(DEFAULT_SYNC_INTERVAL_MINUTES)),
    ),
    Column("last_sync_at", DateTime, nullable=True),
    # last_sync_at + sync_interval_minutes, kept by every write of either; NULL: never synced (due
    # now). The sweep selects due calendars by this index instead of reading every row.
    Column("next_sync_at", DateTime, nullable=True, index=True),
    # "synced", "unchanged" or "error"; NULL until the first sync.
    Column("last_status", String(STATUS_CHARS), nullable=True),
    Column("last_error", String(ERROR_CHARS), nullable=True),
    Column("etag", String(VALIDATOR_CHARS), nullable=True),
    Column("last_modified", String(VALIDATOR_CHARS), nullable=True),
)
