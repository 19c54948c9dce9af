"""Request and response schemas (pydantic) declared to quart-schema for validation and the OpenAPI spec."""

from __future__ import annotations

from collections.abc import Callable
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
    "EventsQuery",
    "HealthOut",
    "IdempotencyHeaders",
    "JobAccepted",
    "JobEventOut",
    "JobList",
    "JobListItem",
    "JobPublic",
    "Page",
    "ProgressOut",
    "ResultQuery",
    "ScheduleList",
    "SchedulePatch",
    "ScheduleView",
    "WorkerList",
    "WorkerOut",
    "optional_parameters",
]

MAX_PAGE_LIMIT = 100
MAX_PAGE_OFFSET = 1_000_000
MAX_DESCRIPTION_CHARS = DESCRIPTION_CHARS


JobStatusName = Literal["PENDING", "STARTED", "RETRY", "SUCCESS", "FAILURE", "CANCELED"]


class _Strict(BaseModel):
    # Unknown fields are refused: a typo should be a 422, not a silently ignored value.
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def _partial_update(*not_null: str) -> Callable[[dict[str, Any]], None]:
    """json_schema_extra of a PATCH body: at least one field, and the `not_null` fields may be left
    out but not sent as null. Their Python type is `X | None = None` (None is "not sent"), which
    pydantic documents as nullable with a null default: the model refuses that null itself (422),
    so the schema keeps only the non-null branch and no default."""

    def complete(schema: dict[str, Any]) -> None:
        schema["minProperties"] = 1
        for name in not_null:
            field = schema["properties"][name]
            field.pop("default", None)
            branches = [branch for branch in field.pop("anyOf") if branch != {"type": "null"}]
            (branch,) = branches
            field.update(branch)

    return complete


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
# The same rules as JSON Schema patterns, for the OpenAPI document only (the validators above decide,
# and name the character they refuse): ECMA-262 regexes matching every text the rule accepts.
# Lone surrogates are refused too, which a pattern cannot say portably (tests/app/test_openapi.py
# checks these against app/text.py).
SINGLE_LINE_PATTERN = r"^[^\u0000-\u001f\u007f-\u009f\u2028\u2029]*$"
MULTI_LINE_PATTERN = r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*$"
_ONE_LINE = {"pattern": SINGLE_LINE_PATTERN}
CalendarName = Annotated[
    str, Field(min_length=1, max_length=255, json_schema_extra=_ONE_LINE), AfterValidator(_single_line)
]
Summary = Annotated[
    str, Field(min_length=1, max_length=1024, json_schema_extra=_ONE_LINE), AfterValidator(_single_line)
]
Description = Annotated[
    str,
    Field(max_length=MAX_DESCRIPTION_CHARS, json_schema_extra={"pattern": MULTI_LINE_PATTERN}),
    AfterValidator(_multi_line),
]


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

    model_config = ConfigDict(json_schema_extra=_partial_update("summary", "start", "end"))

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


class ProgressOut(BaseModel):
    """The job's last progress report (`report_progress` in its code): `fraction` 0..1, `message`
    (null if none), `details` (what the job code added, shown like its result), when (ISO 8601)."""

    fraction: float
    message: str | None
    details: dict[str, Any]
    updated_at: datetime


class JobPublic(BaseModel):
    """The owner's view of a job (built by JobStateSerializerDict): no id, name, user, attempts or dates.

    `payload` is null when the API cannot show it (the job's class is not registered in the API
    process, or its `public_payload` failed); `result` is null until the job succeeds; `error` is
    null unless it failed; `progress` is null until the job reports progress.
    """

    status: JobStatusName
    payload: dict[str, Any] | None
    result: dict[str, Any] | None
    error: str | None
    progress: ProgressOut | None


class JobEventOut(BaseModel):
    """The `data` of one Server-Sent Event: a transition (`type` "status") or a progress report
    (`type` "progress", with `fraction` and `message`). `id` is the SSE id (send it back as
    `Last-Event-ID`); `at_ms` is when it happened, in milliseconds since the epoch."""

    id: str
    type: Literal["status", "progress"]
    job_id: str
    status: JobStatusName
    name: str
    user_uid: str | None
    attempts: int
    at_ms: int
    error: str | None
    fraction: float | None
    message: str | None


def optional_parameters(schema: dict[str, Any]) -> None:
    """json_schema_extra of a query string or headers model whose fields are `X | None = None`: None is
    "not sent" (a query parameter or a header cannot be null), so the document keeps only the X branch."""
    for field in schema["properties"].values():
        if "anyOf" in field:
            (branch,) = [b for b in field.pop("anyOf") if b != {"type": "null"}]
            field.update(branch)
        field.pop("default", None)


class IdempotencyHeaders(BaseModel):
    """The optional request header of an operation that queues a job: a key the client chooses
    (1 to 255 visible ASCII characters) so that its retry of a request whose answer it never saw
    gets the same job instead of a second one (ClientAgent.enqueue_once)."""

    model_config = ConfigDict(json_schema_extra=optional_parameters)

    idempotency_key: str | None = Field(default=None, pattern=r"^[\x21-\x7e]{1,255}$")


class EventsQuery(_Strict):
    """Filters of `GET /admin/events`: the job's name, its user, its status (each optional)."""

    model_config = ConfigDict(json_schema_extra=optional_parameters)

    job: str | None = Field(default=None, min_length=1, max_length=255)
    user: str | None = Field(default=None, min_length=1, max_length=255)
    status: JobStatusName | None = None


class WorkerOut(BaseModel):
    """A live worker process: registered at each heartbeat, gone a lease after its last one."""

    worker_id: str
    host: str
    pid: int
    started_at: datetime
    jobs_running: int
    heartbeat_at: datetime


class WorkerList(BaseModel):
    workers: list[WorkerOut]


RunStatusName = Literal["running", "success", "partial", "error", "cancelled", "skipped"]


class RunsQuery(_Strict):
    """Filters and page of `GET /admin/runs`: kind, status, page size, `before` = the last page's `next`."""

    model_config = ConfigDict(json_schema_extra=optional_parameters)

    kind: str | None = Field(default=None, min_length=1, max_length=255)
    status: RunStatusName | None = None
    limit: int = Field(default=50, ge=1, le=MAX_PAGE_LIMIT)
    before: str | None = Field(default=None, pattern=r"^[0-9]{1,16}:[0-9a-f]{32}$")


class RunOut(BaseModel):
    """A run record (`agent_async.runs`): who started it, how it went, how it ended."""

    run_id: str
    kind: str
    triggered_by: Literal["scheduled", "manual"]
    user_uid: str | None
    status: RunStatusName
    counters: dict[str, Any]
    error: str | None
    failed_ids: list[str]
    job_id: str | None
    group_id: str | None
    started_at: datetime
    finished_at: datetime | None
    heartbeat_at: datetime
    duration_s: float | None


class RunList(BaseModel):
    runs: list[RunOut]
    next: str | None  # pass as `before` for the next (older) page; null on the last page


class GuardOut(BaseModel):
    """A guarded outside connection (`ConnectionGuard`), read on Redis's clock."""

    name: str
    state: Literal["closed", "open", "half-open"]
    failures: int
    cooldown_until: datetime | None
    retry_after_s: float
    trial_in_flight_until: datetime | None
    next_slot_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    observed_at: datetime


class GuardList(BaseModel):
    guards: list[GuardOut]


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


class HealthOut(BaseModel):
    status: Literal["ok"]


class ScheduleOverrideOut(BaseModel):
    """What an operator changed; `cron` is null when only `enabled` was changed (the declared cron runs)."""

    enabled: bool
    cron: str | None
    updated_by: str
    updated_at: datetime


class ScheduleRunOut(BaseModel):
    job_id: str
    status: JobStatusName
    created_at: datetime


class ScheduleSkipOut(BaseModel):
    """A tick that did not run: disabled, or the previous run was still going."""

    fire_at: datetime
    reason: str


class ScheduleView(BaseModel):
    """One schedule as an operator sees it; `recent_skips` are the last five skipped ticks, newest first.

    `effective_cron` is null when the cron in force does not parse (the schedule is then disabled);
    `disabled_reason` is null when it is enabled; `next_run` is null when it is disabled.
    """

    name: str
    default_cron: str
    override: ScheduleOverrideOut | None
    effective_cron: str | None
    enabled: bool
    disabled_reason: str | None
    last_run: ScheduleRunOut | None
    next_run: datetime | None
    recent_skips: list[ScheduleSkipOut]


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]


class SchedulePatch(_Strict):
    """Either field or both; "cron": null goes back to the cron declared on the request."""

    model_config = ConfigDict(json_schema_extra=_partial_update("enabled"))

    enabled: bool | None = None
    cron: str | None = None
