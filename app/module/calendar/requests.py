"""Job requests of the calendar module: the DTOs the API enqueues (no worker imported here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sqlalchemy.exc import OperationalError

from agent_async import JobRequest, StorageUnavailableError

__all__ = ["JobRequestExportIcs", "JobRequestImportIcs"]

# Database outages: the blob store's own error and SQLAlchemy's for the app tables ("database is locked").
_TRANSIENT: tuple[type[BaseException], ...] = (StorageUnavailableError, OperationalError)


@dataclass
class JobRequestExportIcs(JobRequest):
    """Export one calendar to an ICS file in the large store."""

    name: ClassVar[str] = "calendar.export.ics"
    soft_timeout_seconds: ClassVar[float] = 300
    max_try: ClassVar[int] = 3
    # Re-running an export only rewrites a file: safe to resume after a crash.
    resume: ClassVar[bool] = True
    max_concurrent: ClassVar[int] = 1
    # Only a database outage is worth retrying; anything else would fail the same way again.
    retry_for: ClassVar[tuple[type[BaseException], ...]] = _TRANSIENT

    calendar_key: str = ""


@dataclass
class JobRequestImportIcs(JobRequest):
    """Import an uploaded ICS file (saved in the large store as `source_ref`) into a calendar."""

    name: ClassVar[str] = "calendar.import.ics"
    soft_timeout_seconds: ClassVar[float] = 300
    max_try: ClassVar[int] = 3
    # The import upserts by UID, so a re-run after a crash cannot duplicate events.
    resume: ClassVar[bool] = True
    max_concurrent: ClassVar[int] = 1
    # An invalid file (InvalidIcsError) is permanent and fails at once; only outages are retried.
    retry_for: ClassVar[tuple[type[BaseException], ...]] = _TRANSIENT

    calendar_key: str = ""
    source_ref: str = ""
