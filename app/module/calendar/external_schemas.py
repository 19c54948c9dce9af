"""Request and response schemas of the external-calendar endpoints (quart-schema, pydantic)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.api.schemas import CalendarName
from app.module.calendar.tables import DEFAULT_SYNC_INTERVAL_MINUTES, URL_CHARS

__all__ = [
    "MAX_SYNC_INTERVAL_MINUTES",
    "MIN_SYNC_INTERVAL_MINUTES",
    "ExternalCalendarCreate",
    "ExternalCalendarOut",
    "ExternalCalendarPatch",
    "SyncQuery",
]

MIN_SYNC_INTERVAL_MINUTES = 5
MAX_SYNC_INTERVAL_MINUTES = 7 * 24 * 60

SyncInterval = Annotated[int, Field(ge=MIN_SYNC_INTERVAL_MINUTES, le=MAX_SYNC_INTERVAL_MINUTES)]
SourceUrl = Annotated[
    str,
    Field(
        min_length=1, max_length=URL_CHARS,
        description="An http or https URL of an iCalendar file whose host has public addresses only.",
    ),
]


class _Strict(BaseModel):
    # As app.api.schemas: unknown fields are a 422, not silently ignored.
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class ExternalCalendarCreate(_Strict):
    """Subscribe to an ICS URL: a new calendar whose events are the upstream file's."""

    name: CalendarName
    url: SourceUrl
    sync_interval_minutes: SyncInterval = DEFAULT_SYNC_INTERVAL_MINUTES


class ExternalCalendarPatch(_Strict):
    """Change how often the calendar is synced."""

    sync_interval_minutes: SyncInterval


class ExternalCalendarOut(BaseModel):
    """An external calendar and how its last sync went (`last_*` are null before the first sync)."""

    key: str
    name: str
    created_at: datetime
    url: str
    sync_interval_minutes: int
    last_sync_at: datetime | None
    last_status: Literal["synced", "unchanged", "error"] | None
    last_error: str | None


class SyncQuery(BaseModel):
    force: bool = Field(default=False, description="true: a full download, ignoring the stored ETag/Last-Modified.")
