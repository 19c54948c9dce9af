"""run_environment: the body of an async Alembic env.py, shared by the library's and the app's."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from alembic import context
from sqlalchemy import MetaData
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["run_environment", "run_sync"]

_T = TypeVar("_T")


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine from sync code, also when called inside a running loop (in a thread then)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def run_environment(
    *, metadata: MetaData, version_table: str, make_engine: Callable[[str], AsyncEngine]
) -> None:
    """Offline (SQL script), on a connection handed over by the caller, or on an engine of its own."""
    config = context.config

    def configure(**kwargs: Any) -> None:
        context.configure(target_metadata=metadata, version_table=version_table, **kwargs)

    def run_on(connection: Connection) -> None:
        configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()

    async def run_with_own_engine() -> None:
        engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
        try:
            async with engine.connect() as conn:
                await conn.run_sync(run_on)
                await conn.commit()
        finally:
            await engine.dispose()

    if context.is_offline_mode():
        configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
    elif (shared := config.attributes.get("connection")) is not None:
        # upgrade_async() hands over a sync view of its async connection.
        run_on(shared)
    else:
        asyncio.run(run_with_own_engine())
