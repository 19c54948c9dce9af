"""Migrations: the library's blob-store schema, then the application's own tables (two version tables)."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import URL, Connection

from agent_async.storage import upgrade_async as upgrade_storage_async
from agent_async.storage.alembic_env import run_sync
from agent_async.storage.engine import describe
from app.db import create_app_engine, require_async_url

__all__ = ["MIGRATIONS_DIR", "alembic_config", "upgrade", "upgrade_async"]

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    """The app's Alembic Config (no alembic.ini needed); the connection is handed over by upgrade_async."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def _run(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


async def upgrade_async(database_url: str | URL, revision: str = "head") -> None:
    """Bring the blob store and the app tables of `database_url` to their latest schema."""
    url = require_async_url(database_url)  # before the library's migration, which would fail obscurely
    await upgrade_storage_async(url)
    engine = create_app_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run, revision)
            await conn.commit()
    finally:
        await engine.dispose()
    logger.info("app schema of %s at %s", describe(url), revision)


def upgrade(database_url: str | URL, revision: str = "head") -> None:
    """Synchronous upgrade_async; runs in a thread when called from inside an event loop."""
    run_sync(upgrade_async(database_url, revision))
