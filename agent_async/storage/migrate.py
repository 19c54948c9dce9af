"""Schema migrations of the blob store: upgrade(), upgrade_async() and `python -m ...storage.migrate`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import URL, Connection

from agent_async.settings import AgentSettings
from agent_async.storage.alembic_env import run_sync
from agent_async.storage.engine import create_engine, describe, parse_url, translate_errors

__all__ = ["HEAD", "MIGRATIONS_DIR", "alembic_config", "main", "upgrade", "upgrade_async"]

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
HEAD = "head"


def alembic_config(database_url: str | URL | None = None) -> Config:
    """An Alembic Config for the package's migration environment (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url is not None:
        # Alembic's Config interpolates '%': escape it so passwords with '%' survive.
        url = parse_url(database_url).render_as_string(hide_password=False)
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _run(connection: Connection, config: Config, revision: str) -> None:
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


async def upgrade_async(database_url: str | URL, revision: str = HEAD) -> None:
    """Bring the store's tables in `database_url` to `revision` (default: the latest)."""
    url = parse_url(database_url)
    engine = create_engine(url)
    try:
        with translate_errors(url, connecting=True):
            conn = await engine.connect()
        try:
            with translate_errors(url):
                await conn.run_sync(_run, alembic_config(url), revision)
                await conn.commit()
        finally:
            await conn.close()
    finally:
        await engine.dispose()
    logger.info("storage schema of %s at %s", describe(url), revision)


def upgrade(database_url: str | URL, revision: str = HEAD) -> None:
    """Synchronous `upgrade_async`; safe to call from inside a running event loop (runs in a thread)."""
    run_sync(upgrade_async(database_url, revision))


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: migrate AGENT_DATABASE_URL (or --url) to the latest schema."""
    parser = argparse.ArgumentParser(
        prog="python -m agent_async.storage.migrate",
        description="Create or upgrade the agent-async blob store tables.",
    )
    parser.add_argument("--url", help="SQLAlchemy URL; default: $AGENT_DATABASE_URL or the SQLite default")
    parser.add_argument("--revision", default=HEAD, help="target revision (default: head)")
    args = parser.parse_args(argv)
    url = parse_url(args.url or os.environ.get("AGENT_DATABASE_URL") or AgentSettings().database_url)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    upgrade(url, args.revision)
    print(f"storage schema of {describe(url)} is at {args.revision}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
