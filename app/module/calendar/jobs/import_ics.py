"""Worker of calendar.import.ics: loads the uploaded ICS from the large store and upserts it by UID."""

from __future__ import annotations

import logging
from typing import Any

from agent_async import Job, agent_job
from app.module.calendar.ics import InvalidIcsError, parse_ics
from app.module.calendar.repository import CalendarRepository, CalendarStorageError
from app.module.calendar.requests import JobRequestImportIcs
from app.runtime import current_runtime

__all__ = ["JobImportIcs"]

logger = logging.getLogger(__name__)


class UploadGoneError(LookupError):
    """The uploaded file is no longer in the store (consumed by an earlier run, or purged)."""


@agent_job
class JobImportIcs(Job[JobRequestImportIcs]):
    request_class = JobRequestImportIcs

    def public_payload(self, payload: dict[str, Any]) -> dict[str, Any]:
        # The blob's storage locator is internal: the owner sees which calendar, not where the file
        # sits; the file's digest is the idempotency check's (service.py).
        return {key: value for key, value in payload.items() if key not in ("source_ref", "file_sha256")}

    async def process(self, request: JobRequestImportIcs, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        store = self.resources.large_store()
        repository = CalendarRepository(current_runtime().engine)
        key, ref = request.calendar_key, request.source_ref
        calendar = await repository.get_calendar(key, user_uid or "")
        if calendar is None:
            await store.delete(ref)
            raise LookupError(f"calendar {key} does not exist for this user")
        text = await store.load_text(ref)
        if text is None:
            raise UploadGoneError("the uploaded file is no longer available (already imported or purged)")
        try:
            events = parse_ics(text)
        except InvalidIcsError:
            # Permanent: the upload can never import, so it is not kept for a retry.
            await store.delete(ref)
            raise
        try:
            # SQL errors arrive translated (CalendarStorageError, or CalendarStorageUnavailableError
            # which is retried): the job's public error never shows the statement or the driver.
            counts = await repository.upsert_events(key, events)
        except CalendarStorageError:
            # Permanent as well: the same file would be refused again.
            await store.delete(ref)
            raise
        # An input blob is single-use: deleted once its events are committed.
        await store.delete(ref)
        logger.info("job %s imported into %s: %s", job_id, key, counts)
        return counts.as_dict()
