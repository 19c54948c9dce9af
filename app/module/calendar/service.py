"""ModuleCalendar: the calendar module's use cases, shared by the API; enqueues through ClientAgent only."""

from __future__ import annotations

import logging
import uuid

from agent_async import ClientAgent
from app.errors import ApiError
from app.module.calendar.model import Calendar, Event
from app.module.calendar.repository import CalendarRepository
from app.module.calendar.requests import JobRequestExportIcs, JobRequestImportIcs

__all__ = ["ModuleCalendar"]

logger = logging.getLogger(__name__)

UPLOAD_CONTENT_TYPE = "text/calendar"


class ModuleCalendar:
    """Calendars of one owner; another user's calendar is reported as not found, never shown."""

    def __init__(self, repository: CalendarRepository, client: ClientAgent) -> None:
        self._repository = repository
        self._client = client

    async def create(self, owner_uid: str, name: str) -> Calendar:
        return await self._repository.create_calendar(owner_uid, name)

    async def calendars(self, owner_uid: str) -> list[Calendar]:
        return await self._repository.list_calendars(owner_uid)

    async def get(self, key: str, owner_uid: str) -> Calendar:
        calendar = await self._repository.get_calendar(key, owner_uid)
        if calendar is None:
            raise ApiError(404, "calendar_not_found", f"no calendar {key}")
        return calendar

    async def add_event(self, key: str, owner_uid: str, event: Event) -> Event:
        await self.get(key, owner_uid)
        await self._repository.add_event(key, event)
        return event

    async def events(self, key: str, owner_uid: str, *, offset: int, limit: int) -> tuple[list[Event], int]:
        await self.get(key, owner_uid)
        events = await self._repository.list_events(key, offset=offset, limit=limit)
        return events, await self._repository.count_events(key)

    async def export(self, key: str, owner_uid: str) -> str:
        await self.get(key, owner_uid)
        return await self._client.enqueue(JobRequestExportIcs(calendar_key=key), owner_uid)

    async def import_text(self, key: str, owner_uid: str, text: str) -> str:
        """Save the upload first (the worker has no HTTP request), then enqueue only its reference."""
        await self.get(key, owner_uid)
        store = self._client.get_large_store()
        ref = await store.save_text(text, UPLOAD_CONTENT_TYPE)
        try:
            return await self._client.enqueue(JobRequestImportIcs(calendar_key=key, source_ref=ref), owner_uid)
        except BaseException:
            # Nothing will ever consume the upload: do not leave it dangling.
            await store.delete(ref)
            raise


def new_event_uid() -> str:
    return f"{uuid.uuid4().hex}@agent-async"
