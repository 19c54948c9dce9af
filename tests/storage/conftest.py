"""Fixtures of the storage suite: one migrated scratch database per backend per session, unique sources."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from agent_async.storage import ClientStorageDatabase, upgrade
from tests.databases import BACKENDS, scratch_server_database

# Small chunks make multi-chunk blobs cheap; the default (1 MiB) is exercised by the benchmark.
TEST_CHUNK_BYTES = 64 * 1024

MakeStore = Callable[..., ClientStorageDatabase]
RunSql = Callable[..., Awaitable[list[Any]]]


def unique_source() -> str:
    """A source tag no other test uses, so every test owns its own rows."""
    return f"t-{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="session")
def sqlite_database(tmp_path_factory: pytest.TempPathFactory) -> URL:
    """A migrated SQLite file in a folder that did not exist (the migration must create it)."""
    path = tmp_path_factory.mktemp("storage") / "missing-folder" / "blobs.db"
    url = make_url(f"sqlite+aiosqlite:///{path}")
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def postgresql_database() -> Iterator[URL]:
    """A fresh `agent_async_t_<random>` database on the PostgreSQL server, migrated, dropped at the end."""
    yield from scratch_server_database("postgresql")


@pytest.fixture(scope="session")
def mariadb_database() -> Iterator[URL]:
    """A fresh `agent_async_t_<random>` database on the MariaDB server, migrated, dropped at the end."""
    yield from scratch_server_database("mariadb")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test; every contract test runs once per backend."""
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest) -> URL:
    """The migrated scratch database of the backend under test."""
    url: URL = request.getfixturevalue(f"{backend}_database")
    return url


@pytest.fixture
async def make_store(database_url: URL) -> AsyncIterator[MakeStore]:
    """Build stores on the backend under test (unique source, 64 KiB chunks); closes them afterwards."""
    stores: list[ClientStorageDatabase] = []

    def make(source: str | None = None, **kwargs: Any) -> ClientStorageDatabase:
        kwargs.setdefault("chunk_bytes", TEST_CHUNK_BYTES)
        kwargs.setdefault("database_url", database_url)
        store = ClientStorageDatabase(source or unique_source(), **kwargs)
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


@pytest.fixture
def store(make_store: MakeStore) -> ClientStorageDatabase:
    """A store scoped to a source of its own."""
    return make_store()


def sql_runner(database_url: URL) -> RunSql:
    """A function running one raw SQL statement on `database_url` on a fresh connection, committed."""

    async def run(statement: str, params: dict[str, Any] | None = None) -> list[Any]:
        engine = create_async_engine(database_url, poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                result = await conn.execute(text(statement), params or {})
                return list(result.all()) if result.returns_rows else []
        finally:
            await engine.dispose()

    return run


@pytest.fixture
def run_sql(database_url: URL) -> RunSql:
    """Run one raw SQL statement on the test database, outside the store, and commit it."""
    return sql_runner(database_url)
