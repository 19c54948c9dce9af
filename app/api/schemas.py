"""Request and response schemas (pydantic) declared to quart-schema for validation and the OpenAPI spec."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "CalendarCreate",
    "CalendarCreated",
    "CalendarList",
    "CalendarOut",
    "ErrorOut",
    "EventCreate",
    "EventList",
    "EventOut",
    "JobAccepted",
    "JobList",
    "JobListItem",
    "JobPublic",
    "Page",
    "ResultQuery",
]

MAX_PAGE_LIMIT = 100
MAX_PAGE_OFFSET = 1_000_000
MAX_DESCRIPTION_CHARS = 10_000


class _Strict(BaseModel):
    # Unknown fields are refused: a typo should be a 422, not a silently ignored value.
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class ErrorOut(BaseModel):
    """Every error: a stable machine code and a human message."""

    error: str
    message: str


class CalendarCreate(_Strict):
    name: str = Field(min_length=1, max_length=255)


class CalendarCreated(BaseModel):
    key: str


class CalendarOut(BaseModel):
    key: str
    name: str
    created_at: datetime


class CalendarList(BaseModel):
    calendars: list[CalendarOut]


class EventCreate(_Strict):
    """An event; naive times are read as UTC and sub-second parts dropped (ICS has whole seconds)."""

    summary: str = Field(min_length=1, max_length=1024)
    start: datetime
    end: datetime
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)

    @field_validator("start", "end")
    @classmethod
    def _utc_seconds(cls, value: datetime) -> datetime:
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC).replace(microsecond=0)

    @model_validator(mode="after")
    def _end_after_start(self) -> EventCreate:
        if self.end < self.start:
            raise ValueError("end must not be before start")
        return self


class EventOut(BaseModel):
    uid: str
    summary: str
    start: datetime
    end: datetime
    description: str | None


class EventList(BaseModel):
    events: list[EventOut]
    total: int
    offset: int
    limit: int


class JobAccepted(BaseModel):
    job_id: str


class JobPublic(BaseModel):
    """The owner's view of a job (built by JobStateSerializerDict): no id, name, user, attempts or dates."""

    status: Literal["PENDING", "STARTED", "RETRY", "SUCCESS", "FAILURE", "CANCELED"]
    payload: dict[str, Any] | None
    result: dict[str, Any] | None
    error: str | None


class JobListItem(BaseModel):
    job_id: str
    job: JobPublic


class JobList(BaseModel):
    jobs: list[JobListItem]
    total: int
    offset: int
    limit: int


class Page(BaseModel):
    offset: int = Field(default=0, ge=0, le=MAX_PAGE_OFFSET)
    limit: int = Field(default=20, ge=1, le=MAX_PAGE_LIMIT)


class ResultQuery(BaseModel):
    download: bool = False


class ScheduleOverrideOut(BaseModel):
    enabled: bool
    cron: str | None
    updated_by: str
    updated_at: str


class ScheduleRunOut(BaseModel):
    job_id: str
    status: str
    created_at: str | None


class ScheduleView(BaseModel):
    """One schedule as an operator sees it."""

    name: str
    default_cron: str
    override: ScheduleOverrideOut | None
    effective_cron: str | None
    enabled: bool
    disabled_reason: str | None
    last_run: ScheduleRunOut | None
    next_run: str | None


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]


class SchedulePatch(_Strict):
    """Either field or both; "cron": null goes back to the cron declared on the request."""

    enabled: bool | None = None
    cron: str | None = None
