"""Request and response schemas (pydantic) declared to quart-schema for validation and the OpenAPI spec."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from app.module.calendar.tables import DESCRIPTION_CHARS
from app.text import text_problem

__all__ = [
    "CalendarCreate",
    "CalendarCreated",
    "CalendarList",
    "CalendarOut",
    "CalendarPatch",
    "ErrorOut",
    "EventCreate",
    "EventList",
    "EventOut",
    "EventPatch",
    "JobAccepted",
    "JobList",
    "JobListItem",
    "JobPublic",
    "Page",
    "ResultQuery",
]

MAX_PAGE_LIMIT = 100
MAX_PAGE_OFFSET = 1_000_000
MAX_DESCRIPTION_CHARS = DESCRIPTION_CHARS


class _Strict(BaseModel):
    # Unknown fields are refused: a typo should be a 422, not a silently ignored value.
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def _single_line(value: str) -> str:
    problem = text_problem(value, multiline=False)
    if problem is not None:
        raise ValueError(problem)
    return value


def _multi_line(value: str) -> str:
    problem = text_problem(value, multiline=True)
    if problem is not None:
        raise ValueError(problem)
    return value


# What each stored text field may hold (see app/text.py): names and titles are one line, a
# description may have tabs and line breaks; no field may hold NUL or another control character.
CalendarName = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_single_line)]
Summary = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(_single_line)]
Description = Annotated[str, Field(max_length=MAX_DESCRIPTION_CHARS), AfterValidator(_multi_line)]


def _utc_seconds(value: datetime) -> datetime:
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    try:
        return aware.astimezone(UTC).replace(microsecond=0)
    except OverflowError:
        # 9999-12-31T23:00:00-05:00 is a valid ISO time whose UTC value is past year 9999.
        raise ValueError("the time in UTC is outside years 1-9999") from None


class ErrorOut(BaseModel):
    """Every error: a stable machine code and a human message."""

    error: str
    message: str


class CalendarCreate(_Strict):
    name: CalendarName


class CalendarPatch(_Strict):
    """Rename a calendar."""

    name: CalendarName


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

    summary: Summary
    start: datetime
    end: datetime
    description: Description | None = None

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return _utc_seconds(value)

    @model_validator(mode="after")
    def _end_after_start(self) -> EventCreate:
        if self.end < self.start:
            raise ValueError("end must not be before start")
        return self


class EventPatch(_Strict):
    """Any of the event's fields; the others keep their value. `"description": null` clears it.

    The UID is the event's identity (imports upsert by it) and cannot be changed.
    """

    summary: Summary | None = None
    start: datetime | None = None
    end: datetime | None = None
    description: Description | None = None

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else _utc_seconds(value)

    @model_validator(mode="after")
    def _consistent(self) -> EventPatch:
        if not self.model_fields_set:
            raise ValueError("send at least one of summary, start, end, description")
        for name in ("summary", "start", "end"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} cannot be null")
        if self.start is not None and self.end is not None and self.end < self.start:
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
