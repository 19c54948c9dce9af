"""Worker of calendar.export.ics: writes the calendar as an ICS file to the large store."""

from __future__ import annotations

import logging
import re
from typing import Any

from agent_async import Job, agent_job
from app.module.calendar.ics import ICS_CONTENT_TYPE, build_ics
from app.module.calendar.repository import CalendarRepository
from app.module.calendar.requests import JobRequestExportIcs
from app.runtime import current_runtime

__all__ = ["JobExportIcs", "ics_filename"]

logger = logging.getLogger(__name__)

_UNSAFE_FILENAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


class CalendarGoneError(LookupError):
    """The calendar was deleted (or never was the user's) between enqueue and run."""


def ics_filename(calendar_name: str) -> str:
    """A download name made of safe characters only (it ends up in a Content-Disposition header)."""
    stem = _UNSAFE_FILENAME_CHARS.sub("-", calendar_name).strip("-.")[:64] or "calendar"
    return f"{stem}.ics"


@agent_job
class JobExportIcs(Job[JobRequestExportIcs]):
    request_class = JobRequestExportIcs

    async def process(self, request: JobRequestExportIcs, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        repository = CalendarRepository(current_runtime().engine)
        key = request.calendar_key
        # The owner is checked again here: a job only ever reads its own user's calendar.
        calendar = await repository.get_calendar(key, user_uid or "")
        if calendar is None:
            raise CalendarGoneError(f"calendar {key} does not exist for this user")
        events = await repository.list_events(key)
        ref = await self.resources.large_store().save(build_ics(calendar, events), ICS_CONTENT_TYPE)
        logger.info("job %s exported %d events of calendar %s", job_id, len(events), key)
        return {"large_result": ref, "filename": ics_filename(calendar.name), "events": len(events)}
