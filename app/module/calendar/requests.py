"""Job requests of the calendar module: the DTOs the API enqueues (no worker imported here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sqlalchemy.exc import OperationalError

from agent_async import ConnectionCoolingDown, JobRequest, QueueUnavailableError, StorageUnavailableError
from app.module.calendar.fetch import RetryableFetchError

__all__ = ["JobRequestExportIcs", "JobRequestImportIcs", "JobRequestSyncExternal"]

# Outages: the blob store's own error, which the calendar repository's
# CalendarStorageUnavailableError subclasses, SQLAlchemy's in case one arrives untranslated, and
# Redis unreachable for a moment (a ConnectionGuard admits nothing then, or a group lookup fails).
_TRANSIENT: tuple[type[BaseException], ...] = (StorageUnavailableError, OperationalError, QueueUnavailableError)


@dataclass
class _CalendarJobRequest(JobRequest):
    """What the calendar jobs share (an abstract base: it has no name, so it is not registered)."""

    soft_timeout_seconds: ClassVar[float] = 300
    max_try: ClassVar[int] = 3
    # Export rewrites a file and import upserts by UID: both are safe to re-run after a crash.
    resume: ClassVar[bool] = True
    max_concurrent: ClassVar[int] = 1
    # Only an outage is worth retrying; anything else (InvalidIcsError included) fails
    # the same way again, so it fails at once.
    retry_for: ClassVar[tuple[type[BaseException], ...]] = _TRANSIENT

    calendar_key: str = ""


@dataclass
class JobRequestExportIcs(_CalendarJobRequest):
    """Export one calendar to an ICS file in the large store."""

    name: ClassVar[str] = "calendar.export.ics"


@dataclass
class JobRequestImportIcs(_CalendarJobRequest):
    """Import an uploaded ICS file (saved in the large store as `source_ref`) into a calendar."""

    name: ClassVar[str] = "calendar.import.ics"
    # The upload is single-use: deleted once the import ends, however it ends (a cancel, a
    # failure, retries exhausted, a lost worker), so repeating cancelled imports cannot fill the store.
    owned_blobs: ClassVar[tuple[str, ...]] = ("source_ref",)
    source_ref: str = ""
    # The file's SHA-256 (hex): what a repeat under the same idempotency key is compared by, the
    # upload of each request being saved under a new ref.
    file_sha256: str = ""


@dataclass
class JobRequestSyncExternal(JobRequest):
    """Fetch one external calendar and make its events those of the upstream file."""

    name: ClassVar[str] = "calendar.sync.external"
    # Connect + read timeouts and the fetch's own deadline are far shorter (AGENT_FETCH_TIMEOUT_SECONDS).
    soft_timeout_seconds: ClassVar[float] = 300
    max_try: ClassVar[int] = 4
    # The sync upserts by UID and removes what upstream dropped, in one transaction: re-running it is safe.
    resume: ClassVar[bool] = True
    max_concurrent: ClassVar[int] = 1
    # Timeouts, connection and DNS failures, 429 and 5xx (RetryableFetchError), a host whose
    # ConnectionGuard is cooling down, and database outages. A refused address, a 404, a file that is
    # not iCalendar or too large fail at once.
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (
        RetryableFetchError, ConnectionCoolingDown, *_TRANSIENT,
    )

    calendar_key: str = ""
    # True: a full download, without If-None-Match / If-Modified-Since.
    force: bool = False
    # Set by the periodic sweep, whose children run without a user: the owner the calendar must
    # still have (a user's own sync is checked against its user instead).
    owner_uid: str = ""
