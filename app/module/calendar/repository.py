"""CalendarRepository: SQL reads and writes of calendars and events, always scoped to an owner."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Row
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_async import StorageUnavailableError
from app.db import from_db_time, to_db_time
from app.module.calendar import tables
from app.module.calendar.model import Calendar, Event, ImportCounts

__all__ = ["CalendarRepository", "CalendarStorageError", "CalendarStorageUnavailableError"]


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

    async def create_calendar(self, owner_uid: str, name: str) -> Calendar:
        calendar = Calendar(
            key=uuid.uuid4().hex, owner_uid=owner_uid, name=name, created_at=datetime.now(UTC).replace(microsecond=0)
        )
        with storage_errors("the calendar could not be stored"):
            async with self._engine.begin() as conn:
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
            async with self._engine.begin() as conn:
                calendar = await self._owned_calendar(conn, key, owner_uid)
                if calendar is None:
                    return None
                await conn.execute(update(tables.calendars).where(tables.calendars.c.key == key).values(name=name))
        return Calendar(key=calendar.key, owner_uid=calendar.owner_uid, name=name, created_at=calendar.created_at)

    async def delete_calendar(self, key: str, owner_uid: str) -> bool:
        """Delete the calendar and its events in one transaction; False if the owner has no such calendar."""
        with storage_errors("the calendar could not be deleted"):
            async with self._engine.begin() as conn:
                if await self._owned_calendar(conn, key, owner_uid) is None:
                    return False
                # Explicitly: SQLite enforces the ON DELETE CASCADE only with PRAGMA foreign_keys=ON.
                await conn.execute(delete(tables.events).where(tables.events.c.calendar_key == key))
                await conn.execute(delete(tables.calendars).where(tables.calendars.c.key == key))
        return True

    async def count_events(self, key: str) -> int:
        query = select(func.count()).select_from(tables.events).where(tables.events.c.calendar_key == key)
        with storage_errors("the events could not be read"):
            async with self._engine.connect() as conn:
                return int((await conn.execute(query)).scalar_one())

    async def add_event(self, key: str, event: Event) -> None:
        with storage_errors("the event could not be stored"):
            async with self._engine.begin() as conn:
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
            async with self._engine.begin() as conn:
                # Read first rather than trusting rowcount: MySQL counts changed rows, not matched ones.
                if (await conn.execute(select(tables.events.c.id).where(*where))).first() is None:
                    return False
                await conn.execute(update(tables.events).where(*where).values(**_event_values(event)))
        return True

    async def delete_event(self, key: str, uid: str) -> bool:
        where = (tables.events.c.calendar_key == key, tables.events.c.uid == uid)
        with storage_errors("the event could not be deleted"):
            async with self._engine.begin() as conn:
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
        async with self._engine.begin() as conn:
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
        return ImportCounts(imported=imported, updated=updated, skipped=skipped)

    async def _events_by_uid(self, conn: AsyncConnection, key: str) -> dict[str, Event]:
        rows = await conn.execute(select(tables.events).where(tables.events.c.calendar_key == key))
        return {row.uid: _event(row) for row in rows}


def _last_per_uid(incoming: Sequence[Event]) -> list[Event]:
    # A file may repeat a UID (recurrence overrides share it): the last one wins, as a re-import would.
    by_uid: dict[str, Event] = {}
    for event in incoming:
        by_uid[event.uid] = event
    return list(by_uid.values())
