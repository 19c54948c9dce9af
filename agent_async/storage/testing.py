"""Test helpers: a throw-away, migrated database on a PostgreSQL or MariaDB server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from agent_async.storage.engine import parse_url
from agent_async.storage.migrate import upgrade_async

__all__ = ["SCRATCH_PREFIX", "scratch_database"]

SCRATCH_PREFIX = "agent_async_t_"


def _ddl(url: URL, verb: str, name: str) -> str:
    if url.get_backend_name() == "postgresql":
        # FORCE (PostgreSQL 13+) ends sessions a failed test left behind.
        if verb == "create":
            return f'CREATE DATABASE "{name}"'
        return f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
    return f"CREATE DATABASE `{name}`" if verb == "create" else f"DROP DATABASE IF EXISTS `{name}`"


async def _execute(url: URL, statement: str) -> None:
    engine = create_async_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


@asynccontextmanager
async def scratch_database(server_url: str | URL, *, migrate: bool = True) -> AsyncIterator[URL]:
    """Create `agent_async_t_<random>` next to `server_url`'s database, migrate it, yield its URL, drop it.

    `server_url` must be a PostgreSQL or MariaDB/MySQL URL whose user may create databases.
    """
    url = parse_url(server_url)
    if url.get_backend_name() not in ("postgresql", "mysql", "mariadb"):
        raise ValueError(f"scratch_database needs a PostgreSQL or MariaDB URL, got {url.get_backend_name()}")
    name = SCRATCH_PREFIX + uuid.uuid4().hex[:12]
    await _execute(url, _ddl(url, "create", name))
    scratch = url.set(database=name)
    try:
        if migrate:
            await upgrade_async(scratch)
        yield scratch
    finally:
        await _execute(url, _ddl(url, "drop", name))
