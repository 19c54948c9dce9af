"""Worker of calendar.sync.external: fetch one external calendar and make its events the upstream's."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from agent_async import AccessRevoked, ConnectionCoolingDown, Job, agent_job
from agent_async.guard import GuardPermit
from app.module.calendar.fetch import (
    FetchError,
    FetchErrorKind,
    FetchPolicy,
    PermanentFetchError,
    decode_ics,
    fetch_ics,
    parse_source_url,
)
from app.module.calendar.ics import InvalidIcsError, parse_ics
from app.module.calendar.model import SyncCounts
from app.module.calendar.repository import CalendarRepository
from app.module.calendar.requests import JobRequestSyncExternal
from app.runtime import current_runtime

__all__ = ["JobSyncExternal", "guard_name"]

logger = logging.getLogger(__name__)


class ExternalCalendarGoneError(LookupError):
    """The calendar was deleted, or is no longer this user's external calendar, while the sync ran."""


def guard_name(url: str) -> str:
    """The ConnectionGuard name of a source: one per host, shared by every calendar on it."""
    return f"ics:{parse_source_url(url).host}"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@agent_job
class JobSyncExternal(Job[JobRequestSyncExternal]):
    request_class = JobRequestSyncExternal

    async def authorize(self, request: JobRequestSyncExternal, *, user_uid: str, job_id: str) -> None:
        # Queued syncs outlive their reason: a deleted calendar, or one that changed hands, is not
        # fetched (CANCELED, never retried).
        repository = CalendarRepository(current_runtime().engine)
        if await repository.get_external(request.calendar_key, user_uid) is None:
            raise AccessRevoked(f"calendar {request.calendar_key} is no longer an external calendar of this user")

    async def process(
        self, request: JobRequestSyncExternal, *, user_uid: str | None, job_id: str
    ) -> dict[str, Any]:
        runtime = current_runtime()
        repository = CalendarRepository(runtime.engine)
        key, owner = request.calendar_key, user_uid or request.owner_uid
        found = await repository.get_external(key, owner)
        if found is None:
            raise ExternalCalendarGoneError(f"calendar {key} is no longer an external calendar of this user")
        _, source = found
        policy = FetchPolicy.from_settings(runtime.settings)
        conditional = not request.force
        try:
            # Guarded from the first byte sent to the last byte read: a timeout, a 429 or a 5xx
            # (RetryableFetchError is a GuardRetryable) counts against the host; a 404 does not.
            async with runtime.ics_guard.request(guard_name(source.url)) as permit:
                fetched = await fetch_ics(
                    source.url, policy,
                    etag=source.etag if conditional else None,
                    last_modified=source.last_modified if conditional else None,
                )
            if fetched.not_modified:
                await repository.record_sync_outcome(
                    key, at=_now(), status="unchanged",
                    etag=fetched.etag, last_modified=fetched.last_modified, keep_validators=False,
                )
                logger.info("job %s: calendar %s unchanged upstream (304)", job_id, key)
                return {"status": "unchanged", **SyncCounts().as_dict(), "fetched_at": _slot_iso(permit)}
            text = decode_ics(fetched.body or b"", fetched.content_type)
            try:
                events = parse_ics(text)
            except InvalidIcsError as exc:
                raise PermanentFetchError(FetchErrorKind.NOT_ICALENDAR, str(exc)) from None
        except (FetchError, ConnectionCoolingDown) as exc:
            # The events stay as they were; the owner sees why in GET /calendars/<key>/external.
            await repository.record_sync_outcome(key, at=_now(), status="error", error=str(exc))
            raise
        counts = await repository.apply_sync(
            key, owner, events, at=_now(), etag=fetched.etag, last_modified=fetched.last_modified
        )
        if counts is None:
            raise ExternalCalendarGoneError(f"calendar {key} is no longer an external calendar of this user")
        logger.info("job %s synced calendar %s: %s", job_id, key, counts)
        return {"status": "synced", **counts.as_dict(), "fetched_at": _slot_iso(permit)}


def _slot_iso(permit: GuardPermit) -> str:
    """When the host's guard let the request start (its paced slot, on Redis's clock)."""
    return datetime.fromtimestamp(permit.slot_us / 1_000_000, UTC).isoformat()
