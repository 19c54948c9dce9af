"""Records of the calendar module: plain values shared by the API, the repository and the ICS codec."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["Calendar", "Event", "ExternalSource", "ImportCounts", "SyncCounts"]


@dataclass(frozen=True, slots=True)
class Calendar:
    key: str
    owner_uid: str
    name: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Event:
    """One event; times are timezone-aware UTC with whole seconds (what ICS can carry)."""

    uid: str
    summary: str
    start: datetime
    end: datetime
    description: str | None = None


@dataclass(frozen=True, slots=True)
class ImportCounts:
    imported: int = 0
    updated: int = 0
    skipped: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"imported": self.imported, "updated": self.updated, "skipped": self.skipped}


@dataclass(frozen=True, slots=True)
class ExternalSource:
    """What makes a calendar external: where it is fetched from, how often, and how the last sync went.

    `last_status` is "synced" (a 200 applied), "unchanged" (a 304) or "error" (`last_error` says
    why); None before the first sync. `etag` and `last_modified` are the server's validators, sent
    back as If-None-Match / If-Modified-Since.
    """

    calendar_key: str
    url: str
    sync_interval_minutes: int
    last_sync_at: datetime | None = None
    last_status: str | None = None
    last_error: str | None = None
    etag: str | None = None
    last_modified: str | None = None


@dataclass(frozen=True, slots=True)
class SyncCounts:
    imported: int = 0
    updated: int = 0
    skipped: int = 0
    removed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"imported": self.imported, "updated": self.updated, "skipped": self.skipped, "removed": self.removed}
