"""ScheduleOverrides: runtime changes to the schedules declared on JobRequests, stored in SQL."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_async.schedules.tables import schedule_change_table, schedule_override_table
from agent_async.storage.engine import create_engine, parse_url, translate_errors, writing

__all__ = ["UNSET", "ScheduleChange", "ScheduleOverride", "ScheduleOverrides"]

# The scheduler reads overrides at most this stale (the issue allows up to a minute).
_CACHE_S = 5.0


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True, slots=True)
class ScheduleOverride:
    schedule_name: str
    enabled: bool
    cron: str | None
    updated_at_ms: int
    updated_by: str


@dataclass(frozen=True, slots=True)
class ScheduleChange:
    schedule_name: str
    changed_at_ms: int
    changed_by: str
    change: dict[str, Any]


def _override(row: Any) -> ScheduleOverride:
    return ScheduleOverride(
        schedule_name=row["schedule_name"], enabled=bool(row["enabled"]), cron=row["cron"],
        updated_at_ms=row["updated_at_ms"], updated_by=row["updated_by"],
    )


class ScheduleOverrides:
    """Per schedule: enabled, and an optional replacement cron. Reads are cached for a few seconds.

    Each operation opens and closes its own connection (NullPool), like the blob store. The values
    are not validated here: a cron edited by hand in the database is reported by the scheduler.
    """

    def __init__(self, database_url: str, *, namespace: str, clock: Callable[[], float] = time.time) -> None:
        self._url = parse_url(database_url)
        self.namespace = namespace
        self._engine: AsyncEngine | None = None
        self._clock = clock
        self._cache: tuple[float, dict[str, ScheduleOverride]] | None = None

    def _db(self) -> AsyncEngine:
        if self._engine is None:
            self._engine = create_engine(self._url)
        return self._engine

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    async def all(self, *, fresh: bool = False) -> dict[str, ScheduleOverride]:
        now = self._clock()
        if not fresh and self._cache is not None and now - self._cache[0] < _CACHE_S:
            return self._cache[1]
        with translate_errors(self._url):
            async with self._db().connect() as conn:
                rows = (await conn.execute(
                    select(schedule_override_table).where(schedule_override_table.c.namespace == self.namespace)
                )).mappings().all()
        overrides = {row["schedule_name"]: _override(row) for row in rows}
        self._cache = (now, overrides)
        return overrides

    async def set(
        self, schedule_name: str, *, by: str, enabled: bool = UNSET, cron: str | None = UNSET
    ) -> ScheduleOverride:
        """Change the override (creating it if needed) and log the change, in one transaction.

        `cron=None` goes back to the request's own cron; fields left UNSET keep their value.
        """
        now_ms = int(self._clock() * 1000)
        change = {k: v for k, v in (("enabled", enabled), ("cron", cron)) if v is not UNSET}
        table = schedule_override_table
        this = (table.c.namespace == self.namespace) & (table.c.schedule_name == schedule_name)
        with translate_errors(self._url):
            async with writing(self._db()).begin() as conn:
                # The write comes first: on SQLite (WAL) a transaction that read first and writes
                # after another connection committed fails at once ("database is locked") instead
                # of waiting its turn; one that starts by writing waits for the lock.
                await conn.execute(insert(schedule_change_table).values(
                    namespace=self.namespace, schedule_name=schedule_name, changed_at_ms=now_ms, changed_by=by,
                    change=json.dumps(change),
                ))
                current = (await conn.execute(select(table).where(this))).mappings().first()
                values = {"updated_at_ms": now_ms, "updated_by": by, **change}
                if current is None:
                    values = {"namespace": self.namespace, "schedule_name": schedule_name, "enabled": True,
                              "cron": None, **values}
                    await conn.execute(insert(table).values(**values))
                else:
                    await conn.execute(update(table).where(this).values(**values))
                row = (await conn.execute(select(table).where(this))).mappings().one()
        self._cache = None
        return _override(row)

    async def changes(self, schedule_name: str, *, limit: int = 50) -> list[ScheduleChange]:
        """The schedule's changes, newest first."""
        table = schedule_change_table
        query = (
            select(table).where((table.c.namespace == self.namespace) & (table.c.schedule_name == schedule_name))
            .order_by(table.c.changed_at_ms.desc(), table.c.change_id.desc()).limit(limit)
        )
        with translate_errors(self._url):
            async with self._db().connect() as conn:
                rows = (await conn.execute(query)).mappings().all()
        return [
            ScheduleChange(r["schedule_name"], r["changed_at_ms"], r["changed_by"], json.loads(r["change"]))
            for r in rows
        ]

    async def clear(self, schedule_name: str) -> None:
        """Remove the override (tests, tooling); the change log is kept."""
        with translate_errors(self._url):
            async with writing(self._db()).begin() as conn:
                table = schedule_override_table
                this = (table.c.namespace == self.namespace) & (table.c.schedule_name == schedule_name)
                await conn.execute(delete(table).where(this))
        self._cache = None
