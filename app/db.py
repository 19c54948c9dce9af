"""The application's SQL database: one MetaData for its tables and the engine factory."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import MetaData
from sqlalchemy.engine import URL
from sqlalchemy.exc import NoSuchModuleError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agent_async import ConfigurationError, StorageError
from agent_async.storage.engine import configure_sqlite_engine, parse_url

__all__ = [
    "APP_VERSION_TABLE",
    "create_app_engine",
    "from_db_time",
    "metadata",
    "require_async_url",
    "to_db_time",
]

# Alembic bookkeeping of the app, apart from the library's `agent_async_alembic_version`.
APP_VERSION_TABLE = "app_alembic_version"

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


# The async driver of each backend the app supports, for the hint of require_async_url.
_ASYNC_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg", "mysql": "aiomysql", "mariadb": "aiomysql"}


def require_async_url(database_url: str | URL) -> URL:
    """The URL parsed; a ConfigurationError in one line (password masked) if it cannot be used.

    `sqlite:///x.db` names the synchronous driver (pysqlite): SQLAlchemy's asyncio engine refuses it
    only when the first connection is made, deep inside a migration or a request.
    """
    try:
        url = parse_url(database_url)
    except StorageError as exc:
        raise ConfigurationError(f"invalid setting AGENT_DATABASE_URL: {exc}") from None
    shown = url.render_as_string(hide_password=True)
    try:
        dialect = url.get_dialect()
    except NoSuchModuleError:
        raise ConfigurationError(
            f"invalid setting AGENT_DATABASE_URL={shown}: unknown database or driver {url.drivername!r}"
        ) from None
    if not getattr(dialect, "is_async", False):
        backend = url.get_backend_name()
        driver = _ASYNC_DRIVERS.get(backend)
        hint = ""
        if driver:
            hint = f"; use {url.set(drivername=f'{backend}+{driver}').render_as_string(hide_password=True)}"
        raise ConfigurationError(
            f"invalid setting AGENT_DATABASE_URL={shown}: the driver {url.get_driver_name()!r} is not an "
            f"asyncio driver{hint}"
        )
    return url


def create_app_engine(database_url: str | URL) -> AsyncEngine:
    """A pooled engine for the current process (built at start-up, never inherited across a fork)."""
    url = require_async_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        # SQLite will not create the folder of its file.
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url, pool_pre_ping=True, hide_parameters=True)
    if url.get_backend_name() == "sqlite":
        configure_sqlite_engine(engine)
    return engine


def to_db_time(value: datetime) -> datetime:
    """Times are stored as naive UTC: the three databases agree on that, not on time-zone columns."""
    return value.astimezone(UTC).replace(tzinfo=None)


def from_db_time(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)
