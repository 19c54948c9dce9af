"""CalendarRepository: SQL reads and writes of calendars and events, always scoped to an owner."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, delete, func, insert, or_, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Row
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_async import StorageUnavailableError
from agent_async.storage.engine import writing
from app.db import from_db_time, to_db_time
from app.module.calendar import tables
from app.module.calendar.model import Calendar, Event, ExternalSource, ImportCounts, SyncCounts

__all__ = ["CalendarRepository", "CalendarStorageError", "CalendarStorageUnavailableError", "DueCalendar"]


class CalendarStorageError(Exception):
    """The database refused the calendar's data; retrying will not help. The message is safe to show:
    it never carries the driver's message or the SQL statement (those go to the log, as the cause)."""


class CalendarStorageUnavailableError(StorageUnavailableError):
    """The database could not be reached or was busy: transient. Jobs retry it, the API answers 503."""


@contextmanager
def storage_errors(action: str) -> Iterator[None]:
    """Translate SQLAlchemy's errors, whose text holds the SQL and the driver's message, into the two
    errors above: a job's error and an API message are shown to the user as they are. The original
    stays chained as the cause, so the worker's log still has it."""
    unavailable = f"{action}: the database is unavailable; retry later"
    try:
        yield
    except (OperationalError, InterfaceError, sa_exc.TimeoutError, sa_exc.DisconnectionError) as exc:
        raise CalendarStorageUnavailableError(unavailable) from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise CalendarStorageUnavailableError(unavailable) from exc
        raise CalendarStorageError(f"{action}: {_refusal(exc)}") from exc
    except sa_exc.SQLAlchemyError as exc:
        raise CalendarStorageError(f"{action}: unexpected database error") from exc
    except OSError as exc:  # a connection refused before the driver wrapped it
        raise CalendarStorageUnavailableError(unavailable) from exc


def _refusal(exc: DBAPIError) -> str:
    driver = str(exc.orig)
    # PostgreSQL: 'invalid byte sequence for encoding "UTF8": 0x00'.
    if "0x00" in driver or "\\x00" in driver:
        return "the data contains text the database refuses (NUL character)"
    if isinstance(exc, IntegrityError):
        return "the data conflicts with what is stored (a duplicate UID, or the calendar was deleted)"
    return "the database refused the data"


def _calendar(row: Row[tuple[str, str, str, datetime]]) -> Calendar:
    return Calendar(key=row.key, owner_uid=row.owner_uid, name=row.name, created_at=from_db_time(row.created_at))


def _event(row: Row[tuple[str, str, datetime, datetime, str | None]]) -> Event:
    return Event(
        uid=row.uid,
        summary=row.summary,
        start=from_db_time(row.start_at),
        end=from_db_time(row.end_at),
        description=row.description,
    )


def _source(row: Row[Any]) -> ExternalSource:
    return ExternalSource(
        calendar_key=row.calendar_key,
        url=row.url,
        sync_interval_minutes=row.sync_interval_minutes,
        last_sync_at=None if row.last_sync_at is None else from_db_time(row.last_sync_at),
        last_status=row.last_status,
        last_error=row.last_error,
        etag=row.etag,
        last_modified=row.last_modified,
    )


def _cut(text: str | None, limit: int) -> str | None:
    return None if text is None else text[:limit]


def _validator(value: str | None) -> str | None:
    # A cut ETag would never match again: one too long for its column is simply not kept.
    return value if value is not None and len(value) <= tables.VALIDATOR_CHARS else None


def _event_values(event: Event) -> dict[str, object]:
    return {
        "summary": event.summary,
        "start_at": to_db_time(event.start),
        "end_at": to_db_time(event.end),
        "description": event.description,
    }


class CalendarRepository:
    """Every read takes the owner's uid: another user's calendar is simply not found."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        # Every begin() below writes: on SQLite it takes the write lock up front (see `writing`).
        self._writer = writing(engine)

    async def create_calendar(self, owner_uid: str, name: str) -> Calendar:
        calendar = Calendar(
            key=uuid.uuid4().hex, owner_uid=owner_uid, name=name, created_at=datetime.now(UTC).replace(microsecond=0)
        )
        with storage_errors("the calendar could not be stored"):
            async with self._writer.begin() as conn:
                await conn.execute(
                    insert(tables.calendars).values(
                        key=calendar.key, owner_uid=owner_uid, name=name, created_at=to_db_time(calendar.created_at)
                    )
                )
        return calendar

    async def list_calendars(self, owner_uid: str) -> list[Calendar]:
        query = (
            select(tables.calendars)
            .where(tables.calendars.c.owner_uid == owner_uid)
            .order_by(tables.calendars.c.created_at, tables.calendars.c.key)
        )
        with storage_errors("the calendars could not be read"):
            async with self._engine.connect() as conn:
                return [_calendar(row) for row in await conn.execute(query)]

    async def get_calendar(self, key: str, owner_uid: str) -> Calendar | None:
        with storage_errors("the calendar could not be read"):
            async with self._engine.connect() as conn:
                return await self._owned_calendar(conn, key, owner_uid)

    async def rename_calendar(self, key: str, owner_uid: str, name: str) -> Calendar | None:
        """The renamed calendar, or None if the owner has no such calendar."""
        with storage_errors("the calendar could not be stored"):
            async with self._writer.begin() as conn:
                calendar = await self._owned_calendar(conn, key, owner_uid)
                if calendar is None:
                    return None
                await conn.execute(update(tables.calendars).where(tables.calendars.c.key == key).values(name=name))
        return Calendar(key=calendar.key, owner_uid=calendar.owner_uid, name=name, created_at=calendar.created_at)

    async def delete_calendar(self, key: str, owner_uid: str) -> bool:
        """Delete the calendar and its events in one transaction; False if the owner has no such calendar."""
        with storage_errors("the calendar could not be deleted"):
            async with self._writer.begin() as conn:
                if await self._owned_calendar(conn, key, owner_uid) is None:
                    return False
                # Explicitly: SQLite enforces the ON DELETE CASCADE only with PRAGMA foreign_keys=ON.
                await conn.execute(delete(tables.events).where(tables.events.c.calendar_key == key))
                await conn.execute(
                    delete(tables.external_sources).where(tables.external_sources.c.calendar_key == key)
                )
                await conn.execute(delete(tables.calendars).where(tables.calendars.c.key == key))
        return True

    async def count_events(self, key: str) -> int:
        query = select(func.count()).select_from(tables.events).where(tables.events.c.calendar_key == key)
        with storage_errors("the events could not be read"):
            async with self._engine.connect() as conn:
                return int((await conn.execute(query)).scalar_one())

    async def add_event(self, key: str, event: Event) -> None:
        with storage_errors("the event could not be stored"):
            async with self._writer.begin() as conn:
                await conn.execute(
                    insert(tables.events).values(calendar_key=key, uid=event.uid, **_event_values(event))
                )

    async def get_event(self, key: str, uid: str) -> Event | None:
        query = select(tables.events).where(tables.events.c.calendar_key == key, tables.events.c.uid == uid)
        with storage_errors("the event could not be read"):
            async with self._engine.connect() as conn:
                row = (await conn.execute(query)).first()
        return None if row is None else _event(row)

    async def replace_event(self, key: str, event: Event) -> bool:
        """Store `event`'s fields under its UID; False if the calendar has no event with that UID."""
        where = (tables.events.c.calendar_key == key, tables.events.c.uid == event.uid)
        with storage_errors("the event could not be stored"):
            async with self._writer.begin() as conn:
                # Read first rather than trusting rowcount: MySQL counts changed rows, not matched ones.
                if (await conn.execute(select(tables.events.c.id).where(*where))).first() is None:
                    return False
                await conn.execute(update(tables.events).where(*where).values(**_event_values(event)))
        return True

    async def delete_event(self, key: str, uid: str) -> bool:
        where = (tables.events.c.calendar_key == key, tables.events.c.uid == uid)
        with storage_errors("the event could not be deleted"):
            async with self._writer.begin() as conn:
                if (await conn.execute(select(tables.events.c.id).where(*where))).first() is None:
                    return False
                await conn.execute(delete(tables.events).where(*where))
        return True

    async def list_events(self, key: str, *, offset: int = 0, limit: int | None = None) -> list[Event]:
        query = (
            select(tables.events)
            .where(tables.events.c.calendar_key == key)
            .order_by(tables.events.c.start_at, tables.events.c.uid)
            .offset(offset)
            .limit(limit)
        )
        with storage_errors("the events could not be read"):
            async with self._engine.connect() as conn:
                return [_event(row) for row in await conn.execute(query)]

    async def upsert_events(self, key: str, incoming: Sequence[Event]) -> ImportCounts:
        """Insert new UIDs, update changed ones, skip identical ones; one transaction, idempotent."""
        with storage_errors("the calendar could not be stored"):
            return await self._upsert_events(key, incoming)

    async def _owned_calendar(self, conn: AsyncConnection, key: str, owner_uid: str) -> Calendar | None:
        query = select(tables.calendars).where(
            tables.calendars.c.key == key, tables.calendars.c.owner_uid == owner_uid
        )
        row = (await conn.execute(query)).first()
        return None if row is None else _calendar(row)

    async def _upsert_events(self, key: str, incoming: Sequence[Event]) -> ImportCounts:
        async with self._writer.begin() as conn:
            counts, _ = await self._upsert_in(conn, key, incoming)
        return counts

    async def _upsert_in(
        self, conn: AsyncConnection, key: str, incoming: Sequence[Event]
    ) -> tuple[ImportCounts, dict[str, Event]]:
        """Upsert inside the caller's transaction; also answers the events that were there before."""
        existing = await self._events_by_uid(conn, key)
        imported = updated = skipped = 0
        new_rows: list[dict[str, object]] = []
        for event in _last_per_uid(incoming):
            current = existing.get(event.uid)
            if current is None:
                new_rows.append({"calendar_key": key, "uid": event.uid, **_event_values(event)})
                imported += 1
            elif current == event:
                skipped += 1
            else:
                await conn.execute(
                    update(tables.events)
                    .where(tables.events.c.calendar_key == key, tables.events.c.uid == event.uid)
                    .values(**_event_values(event))
                )
                updated += 1
        if new_rows:
            await conn.execute(insert(tables.events), new_rows)
        return ImportCounts(imported=imported, updated=updated, skipped=skipped), existing

    # --- external calendars ------------------------------------------------------------------------------

    async def create_external_calendar(
        self, owner_uid: str, name: str, url: str, sync_interval_minutes: int
    ) -> tuple[Calendar, ExternalSource]:
        """A calendar and its source, in one transaction."""
        calendar = Calendar(
            key=uuid.uuid4().hex, owner_uid=owner_uid, name=name, created_at=datetime.now(UTC).replace(microsecond=0)
        )
        source = ExternalSource(calendar_key=calendar.key, url=url, sync_interval_minutes=sync_interval_minutes)
        with storage_errors("the calendar could not be stored"):
            async with self._writer.begin() as conn:
                await conn.execute(
                    insert(tables.calendars).values(
                        key=calendar.key, owner_uid=owner_uid, name=name, created_at=to_db_time(calendar.created_at)
                    )
                )
                await conn.execute(
                    insert(tables.external_sources).values(
                        calendar_key=calendar.key, url=url, sync_interval_minutes=sync_interval_minutes
                    )
                )
        return calendar, source

    async def get_external(self, key: str, owner_uid: str) -> tuple[Calendar, ExternalSource] | None:
        """The owner's calendar and its source; None if it is not the owner's or not external."""
        with storage_errors("the calendar could not be read"):
            async with self._engine.connect() as conn:
                return await self._owned_external(conn, key, owner_uid)

    async def set_sync_interval(
        self, key: str, owner_uid: str, minutes: int
    ) -> tuple[Calendar, ExternalSource] | None:
        with storage_errors("the calendar could not be stored"):
            async with self._writer.begin() as conn:
                found = await self._owned_external(conn, key, owner_uid)
                if found is None:
                    return None
                calendar, source = found
                last = None if source.last_sync_at is None else to_db_time(source.last_sync_at)
                await conn.execute(
                    update(tables.external_sources)
                    .where(tables.external_sources.c.calendar_key == key)
                    .values(sync_interval_minutes=minutes, next_sync_at=_next_sync(last, minutes))
                )
        return calendar, dataclasses.replace(source, sync_interval_minutes=minutes)

    async def record_sync_outcome(
        self, key: str, *, at: datetime, status: str, error: str | None = None,
        etag: str | None = None, last_modified: str | None = None, keep_validators: bool = True,
    ) -> bool:
        """Store how a sync ended without touching the events (an error, or a 304); False if the
        calendar is no longer external. `keep_validators` leaves the stored ETag / Last-Modified alone."""
        values: dict[str, object] = {
            "last_sync_at": to_db_time(at), "last_status": status, "last_error": _cut(error, tables.ERROR_CHARS),
        }
        if not keep_validators:
            values |= {"etag": _validator(etag), "last_modified": _validator(last_modified)}
        where = tables.external_sources.c.calendar_key == key
        with storage_errors("the calendar could not be stored"):
            async with self._writer.begin() as conn:
                interval = tables.external_sources.c.sync_interval_minutes
                minutes = (await conn.execute(select(interval).where(where))).scalar()
                if minutes is None:
                    return False
                values["next_sync_at"] = _next_sync(to_db_time(at), minutes)
                await conn.execute(update(tables.external_sources).where(where).values(**values))
        return True

    async def apply_sync(
        self, key: str, owner_uid: str, events: Sequence[Event], *, at: datetime,
        etag: str | None, last_modified: str | None,
    ) -> SyncCounts | None:
        """Make the calendar's events exactly `events` (upsert by UID, remove the UIDs upstream no
        longer has) and record the sync, all in one transaction: a failure leaves the calendar as it
        was. None if the calendar is no longer the owner's external calendar. Idempotent."""
        with storage_errors("the calendar could not be stored"):
            async with self._writer.begin() as conn:
                found = await self._owned_external(conn, key, owner_uid)
                if found is None:
                    return None
                counts, existing = await self._upsert_in(conn, key, events)
                gone = sorted(set(existing) - {event.uid for event in events})
                for start in range(0, len(gone), 500):
                    await conn.execute(
                        delete(tables.events).where(
                            tables.events.c.calendar_key == key, tables.events.c.uid.in_(gone[start:start + 500])
                        )
                    )
                await conn.execute(
                    update(tables.external_sources)
                    .where(tables.external_sources.c.calendar_key == key)
                    .values(
                        last_sync_at=to_db_time(at), last_status="synced", last_error=None,
                        next_sync_at=_next_sync(to_db_time(at), found[1].sync_interval_minutes),
                        etag=_validator(etag), last_modified=_validator(last_modified),
                    )
                )
        return SyncCounts(imported=counts.imported, updated=counts.updated, skipped=counts.skipped, removed=len(gone))

    async def due_external(self, now: datetime, *, limit: int) -> list[DueCalendar]:
        """The external calendars due for a sync at `now`: never synced, or last synced at least
        their interval ago; the longest waiting first (never synced before all), at most `limit`.
        One indexed query (`next_sync_at`), whatever the number of calendars."""
        t = tables.external_sources
        query = (
            select(t.c.calendar_key, tables.calendars.c.owner_uid, t.c.url)
            .join(tables.calendars, tables.calendars.c.key == t.c.calendar_key)
            .where(or_(t.c.next_sync_at.is_(None), t.c.next_sync_at <= to_db_time(now)))
            # NULLS FIRST, spelled so that every database accepts it.
            .order_by(case((t.c.next_sync_at.is_(None), 0), else_=1), t.c.next_sync_at, t.c.calendar_key)
            .limit(limit)
        )
        with storage_errors("the calendars could not be read"):
            async with self._engine.connect() as conn:
                rows = list(await conn.execute(query))
        return [DueCalendar(key=row.calendar_key, owner_uid=row.owner_uid, url=row.url) for row in rows]

    async def sync_statuses(self, keys: Sequence[str]) -> dict[str, tuple[str | None, datetime | None]]:
        """key -> (last_status, last_sync_at) of those external calendars that still exist."""
        found: dict[str, tuple[str | None, datetime | None]] = {}
        table = tables.external_sources
        with storage_errors("the calendars could not be read"):
            async with self._engine.connect() as conn:
                for start in range(0, len(keys), 500):
                    query = select(table.c.calendar_key, table.c.last_status, table.c.last_sync_at).where(
                        table.c.calendar_key.in_(list(keys[start:start + 500]))
                    )
                    for row in await conn.execute(query):
                        at = None if row.last_sync_at is None else from_db_time(row.last_sync_at)
                        found[row.calendar_key] = (row.last_status, at)
        return found

    async def _owned_external(
        self, conn: AsyncConnection, key: str, owner_uid: str
    ) -> tuple[Calendar, ExternalSource] | None:
        query = (
            select(tables.calendars, tables.external_sources)
            .join(tables.external_sources, tables.external_sources.c.calendar_key == tables.calendars.c.key)
            .where(tables.calendars.c.key == key, tables.calendars.c.owner_uid == owner_uid)
        )
        row = (await conn.execute(query)).first()
        if row is None:
            return None
        return _calendar(row), _source(row)

    async def _events_by_uid(self, conn: AsyncConnection, key: str) -> dict[str, Event]:
        rows = await conn.execute(select(tables.events).where(tables.events.c.calendar_key == key))
        return {row.uid: _event(row) for row in rows}


def _next_sync(last: datetime | None, minutes: int) -> datetime | None:
    return None if last is None else last + timedelta(minutes=minutes)


@dataclasses.dataclass(frozen=True, slots=True)
class DueCalendar:
    """An external calendar the sweep should sync: its key, its owner when selected, its URL."""

    key: str
    owner_uid: str
    url: str


def _last_per_uid(incoming: Sequence[Event]) -> list[Event]:
    # A file may repeat a UID (recurrence overrides share it): the last one wins, as a re-import would.
    by_uid: dict[str, Event] = {}
    for event in incoming:
        by_uid[event.uid] = event
    return list(by_uid.values())
