"""CalendarRepository: SQL reads and writes of calendars and events, always scoped to an owner."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db import from_db_time, to_db_time
from app.module.calendar import tables
from app.module.calendar.model import Calendar, Event, ImportCounts

__all__ = ["CalendarRepository"]


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
        async with self._engine.connect() as conn:
            return [_calendar(row) for row in await conn.execute(query)]

    async def get_calendar(self, key: str, owner_uid: str) -> Calendar | None:
        query = select(tables.calendars).where(
            tables.calendars.c.key == key, tables.calendars.c.owner_uid == owner_uid
        )
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return None if row is None else _calendar(row)

    async def count_events(self, key: str) -> int:
        query = select(func.count()).select_from(tables.events).where(tables.events.c.calendar_key == key)
        async with self._engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def add_event(self, key: str, event: Event) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(insert(tables.events).values(calendar_key=key, uid=event.uid, **_event_values(event)))

    async def list_events(self, key: str, *, offset: int = 0, limit: int | None = None) -> list[Event]:
        query = (
            select(tables.events)
            .where(tables.events.c.calendar_key == key)
            .order_by(tables.events.c.start_at, tables.events.c.uid)
            .offset(offset)
            .limit(limit)
        )
        async with self._engine.connect() as conn:
            return [_event(row) for row in await conn.execute(query)]

    async def upsert_events(self, key: str, incoming: Sequence[Event]) -> ImportCounts:
        """Insert new UIDs, update changed ones, skip identical ones; one transaction, idempotent."""
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
