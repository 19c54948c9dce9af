"""Alembic environment of the application: async drivers, its own version table, the app's MetaData."""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

import app.module.calendar.tables  # noqa: F401 - registers the calendar tables on the MetaData
from app.db import APP_VERSION_TABLE, create_app_engine, metadata

config = context.config


def _configure(**kwargs: Any) -> None:
    context.configure(target_metadata=metadata, version_table=APP_VERSION_TABLE, **kwargs)


def _run_on(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_own_engine() -> None:
    engine = create_app_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run_on)
            await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (shared := config.attributes.get("connection")) is not None:
    # app.migrate.upgrade_async hands over a sync view of its async connection.
    _run_on(shared)
else:
    asyncio.run(_run_with_own_engine())
