"""ModuleCalendar: the calendar module's use cases, shared by the API; enqueues through ClientAgent only."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import uuid
from typing import Any

from agent_async import ClientAgent, EnqueuedOnce, JobRequest, RequestCode, RequestRefusedError, keyed_job_id
from app.errors import ApiError
from app.module.calendar.fetch import FetchError, FetchPolicy, check_url
from app.module.calendar.model import Calendar, Event, ExternalSource
from app.module.calendar.repository import CalendarRepository
from app.module.calendar.requests import JobRequestExportIcs, JobRequestImportIcs, JobRequestSyncExternal
from app.module.calendar.tables import UID_CHARS, URL_CHARS
from app.text import single_line_problem

__all__ = ["ModuleCalendar", "enqueue_keyed"]

logger = logging.getLogger(__name__)

UPLOAD_CONTENT_TYPE = "text/calendar"

# Every calendar key is a uuid4 hex (CalendarRepository.create_calendar). Anything else is not found
# without a query: a NUL in the URL made PostgreSQL fail the lookup itself (a 500).
_KEY = re.compile(r"[0-9a-f]{32}")


def _calendar_not_found(key: str) -> ApiError:
    return ApiError(404, "calendar_not_found", f"no calendar {key}")


def _event_not_found(uid: str) -> ApiError:
    return ApiError(404, "event_not_found", f"no event {uid} in this calendar")


def _not_external(key: str) -> ApiError:
    return ApiError(404, "subscription_not_found", f"calendar {key} is not an external calendar")


def _storable_uid(uid: str) -> bool:
    # Imported UIDs follow the same rule (ics.parse_ics): one that breaks it was never stored.
    return 0 < len(uid) <= UID_CHARS and single_line_problem(uid) is None


class ModuleCalendar:
    """Calendars of one owner; another user's calendar is reported as not found, never shown."""

    def __init__(
        self, repository: CalendarRepository, client: ClientAgent, fetch_policy: FetchPolicy | None = None
    ) -> None:
        self._repository = repository
        self._client = client
        self._fetch_policy = fetch_policy if fetch_policy is not None else FetchPolicy()

    async def create(self, owner_uid: str, name: str) -> Calendar:
        return await self._repository.create_calendar(owner_uid, name)

    async def calendars(self, owner_uid: str) -> list[Calendar]:
        return await self._repository.list_calendars(owner_uid)

    async def get(self, key: str, owner_uid: str) -> Calendar:
        calendar = await self._repository.get_calendar(key, owner_uid) if _KEY.fullmatch(key) else None
        if calendar is None:
            raise _calendar_not_found(key)
        return calendar

    async def rename(self, key: str, owner_uid: str, name: str) -> Calendar:
        calendar = await self._repository.rename_calendar(key, owner_uid, name) if _KEY.fullmatch(key) else None
        if calendar is None:
            raise _calendar_not_found(key)
        return calendar

    async def delete(self, key: str, owner_uid: str) -> None:
        """Delete the calendar and its events. A job already queued for it fails: calendar gone."""
        if not (_KEY.fullmatch(key) and await self._repository.delete_calendar(key, owner_uid)):
            raise _calendar_not_found(key)

    async def update_event(self, key: str, owner_uid: str, uid: str, changes: dict[str, Any]) -> Event:
        """Apply `changes` (fields of Event, never the UID) to the event; 422 if it would end before it starts."""
        await self.get(key, owner_uid)
        current = await self._repository.get_event(key, uid) if _storable_uid(uid) else None
        if current is None:
            raise _event_not_found(uid)
        updated = dataclasses.replace(current, **changes)
        if updated.end < updated.start:
            raise ApiError(
                422, "invalid_body",
                f"end must not be before start (the event would run {updated.start.isoformat()} "
                f"to {updated.end.isoformat()})",
            )
        if not await self._repository.replace_event(key, updated):
            raise _event_not_found(uid)  # deleted meanwhile
        return updated

    async def delete_event(self, key: str, owner_uid: str, uid: str) -> None:
        await self.get(key, owner_uid)
        if not (_storable_uid(uid) and await self._repository.delete_event(key, uid)):
            raise _event_not_found(uid)

    async def add_event(self, key: str, owner_uid: str, event: Event) -> Event:
        await self.get(key, owner_uid)
        await self._repository.add_event(key, event)
        return event

    async def events(self, key: str, owner_uid: str, *, offset: int, limit: int) -> tuple[list[Event], int]:
        await self.get(key, owner_uid)
        events = await self._repository.list_events(key, offset=offset, limit=limit)
        return events, await self._repository.count_events(key)

    async def export(self, key: str, owner_uid: str, *, idempotency_key: str | None = None) -> EnqueuedOnce:
        await self.get(key, owner_uid)
        return await self._queue(JobRequestExportIcs(calendar_key=key), owner_uid, idempotency_key)

    async def import_text(
        self, key: str, owner_uid: str, text: str, *, idempotency_key: str | None = None
    ) -> EnqueuedOnce:
        """Save the upload first (the worker has no HTTP request), then enqueue only its reference.
        A repeat under an idempotency key is compared by calendar and file digest (each upload is
        saved under a ref of its own), and saves nothing."""
        await self.get(key, owner_uid)
        digest = hashlib.sha256(text.encode()).hexdigest()
        if idempotency_key is not None:
            earlier = await self._earlier_import(key, owner_uid, idempotency_key, digest)
            if earlier is not None:
                return earlier
        store = self._client.get_large_store()
        ref = await store.save_text(text, UPLOAD_CONTENT_TYPE)
        request = JobRequestImportIcs(calendar_key=key, source_ref=ref, file_sha256=digest)
        try:
            return await self._queue(request, owner_uid, idempotency_key)
        except BaseException as exc:
            # Nothing will ever consume the upload: do not leave it dangling.
            await store.delete(ref)
            reused = isinstance(exc, RequestRefusedError) and exc.code is RequestCode.IDEMPOTENCY_KEY_REUSED
            if reused and idempotency_key is not None:
                # A request with this key queued its import meanwhile (a retry sent while the first
                # was in flight): the same import if it is the same file.
                earlier = await self._earlier_import(key, owner_uid, idempotency_key, digest)
                if earlier is not None:
                    return earlier
            raise

    async def _earlier_import(self, key: str, owner_uid: str, idempotency_key: str, digest: str) -> EnqueuedOnce | None:
        state = await self._client.get_state(keyed_job_id(JobRequestImportIcs.name, owner_uid, idempotency_key))
        if state is None:
            return None
        if (state.payload.get("calendar_key"), state.payload.get("file_sha256")) != (key, digest):
            raise RequestRefusedError(
                RequestCode.IDEMPOTENCY_KEY_REUSED,
                f"{JobRequestImportIcs.name}: this idempotency key was used for another import (job {state.job_id})",
            )
        return EnqueuedOnce(state.job_id, replayed=True)

    async def _queue(self, request: JobRequest, owner_uid: str, idempotency_key: str | None) -> EnqueuedOnce:
        return await enqueue_keyed(self._client, request, owner_uid, idempotency_key)

    # --- external calendars ---------------------------------------------------------------------------

    async def subscribe(
        self, owner_uid: str, name: str, url: str, sync_interval_minutes: int
    ) -> tuple[Calendar, ExternalSource]:
        """A new external calendar; 422 `url_refused` naming why when the URL may not be fetched
        (checked now, and again at every fetch and redirect)."""
        try:
            checked = str(await check_url(url, self._fetch_policy))
        except FetchError as exc:
            raise ApiError(422, "url_refused", f"the URL cannot be subscribed: {exc}") from None
        if len(checked) > URL_CHARS:
            raise ApiError(422, "url_refused", f"the URL is longer than {URL_CHARS} characters once encoded")
        return await self._repository.create_external_calendar(owner_uid, name, checked, sync_interval_minutes)

    async def external(self, key: str, owner_uid: str) -> tuple[Calendar, ExternalSource]:
        await self.get(key, owner_uid)
        found = await self._repository.get_external(key, owner_uid)
        if found is None:
            raise _not_external(key)
        return found

    async def set_sync_interval(self, key: str, owner_uid: str, minutes: int) -> tuple[Calendar, ExternalSource]:
        await self.external(key, owner_uid)
        found = await self._repository.set_sync_interval(key, owner_uid, minutes)
        if found is None:
            raise _calendar_not_found(key)  # deleted meanwhile
        return found

    async def sync(
        self, key: str, owner_uid: str, *, force: bool = False, idempotency_key: str | None = None
    ) -> EnqueuedOnce:
        """Queue a sync of the external calendar now."""
        await self.external(key, owner_uid)
        return await self._queue(JobRequestSyncExternal(calendar_key=key, force=force), owner_uid, idempotency_key)


async def enqueue_keyed(
    client: ClientAgent, request: JobRequest, user_uid: str | None, idempotency_key: str | None
) -> EnqueuedOnce:
    """The job of a request that may carry an Idempotency-Key: queued once per key, or each time without one."""
    if idempotency_key is None:
        return EnqueuedOnce(await client.enqueue(request, user_uid), replayed=False)
    return await client.enqueue_once(request, user_uid, key=idempotency_key)


def new_event_uid() -> str:
    return f"{uuid.uuid4().hex}@agent-async"
