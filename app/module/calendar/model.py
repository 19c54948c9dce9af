"""Records of the calendar module: plain values shared by the API, the repository and the ICS codec."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["Calendar", "Event", "ImportCounts"]


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
