"""Engines for the blob store: URL checks, SQLite set-up, and driver errors turned into StorageErrors."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from agent_async.errors import StorageError, StorageUnavailableError

__all__ = [
    "backend_name", "configure_sqlite_engine", "create_engine", "parse_url", "translate_errors", "writing",
]

logger = logging.getLogger(__name__)

# Seconds a SQLite writer waits for another writer's lock before failing ("database is locked").
SQLITE_BUSY_TIMEOUT_S = 30.0
_BACKENDS = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mysql": "MariaDB/MySQL", "mariadb": "MariaDB"}


def parse_url(database_url: str | URL) -> URL:
    """The URL as an SQLAlchemy URL; a StorageError (without the password) if it cannot be parsed."""
    if isinstance(database_url, URL):
        return database_url
    try:
        return make_url(database_url)
    except exc.ArgumentError:
        # The raw string may hold a password: name only its scheme.
        scheme = database_url.partition("://")[0] if "://" in database_url else "?"
        raise StorageError(f"cannot parse the storage database URL (scheme {scheme!r})") from None


def backend_name(url: URL) -> str:
    """A human name for the URL's database, for messages."""
    return _BACKENDS.get(url.get_backend_name(), url.get_backend_name())


def describe(url: URL) -> str:
    """`backend at url` with the password masked; safe to log and to put in exceptions."""
    return f"{backend_name(url)} at {url.render_as_string(hide_password=True)}"


def ensure_sqlite_folder(url: URL) -> None:
    """Create the parent folder of a SQLite file, which SQLite itself will not do."""
    if url.get_backend_name() != "sqlite":
        return
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return
    Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # The driver's own implicit BEGIN breaks SAVEPOINT semantics (a RELEASE would commit); turn it
    # off and let SQLAlchemy's "begin" event emit BEGIN instead (SQLAlchemy's documented recipe).
    dbapi_connection.isolation_level = None
    # WAL lets readers (the API) proceed while a worker writes; busy_timeout makes concurrent
    # writers queue instead of failing at once.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
    cursor.close()


# Execution option of an engine whose transactions will write (see `writing`).
_SQLITE_WRITE = "agent_async_sqlite_write"


def _sqlite_on_begin(connection: Any) -> None:
    immediate = connection.get_execution_options().get(_SQLITE_WRITE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def writing(engine: AsyncEngine) -> AsyncEngine:
    """`engine` for transactions that write. On SQLite they begin IMMEDIATE: the write lock is taken
    up front, so concurrent writers queue on busy_timeout. A plain BEGIN reads first and upgrades at
    the first write, and an upgrade that finds another writer's commit fails at once with "database
    is locked" (SQLITE_BUSY_SNAPSHOT, which busy_timeout does not cover): 11 of 12 concurrent
    calendar syncs failed that way. Other databases: the engine as it is."""
    if engine.dialect.name != "sqlite":
        return engine
    return engine.execution_options(**{_SQLITE_WRITE: True})


def configure_sqlite_engine(engine: AsyncEngine) -> None:
    """Give a SQLite engine real transactions and savepoints, WAL and a busy timeout.

    Engines from `create_engine` have it; apply it to your own engine before passing one of its
    connections to a store, or a failed save inside your transaction would not roll back cleanly.
    """
    event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
    event.listen(engine.sync_engine, "begin", _sqlite_on_begin)


def create_engine(url: URL) -> AsyncEngine:
    """An engine that keeps no connection between operations (NullPool): safe across forks and loops."""
    ensure_sqlite_folder(url)
    engine = create_async_engine(url, poolclass=NullPool, hide_parameters=True)
    if url.get_backend_name() == "sqlite":
        configure_sqlite_engine(engine)
    return engine


def _scrub(message: str, url: URL) -> str:
    if url.password:
        message = message.replace(str(url.password), "***")
    return message


def _driver_message(error: BaseException) -> str:
    # SQLAlchemy's own str() appends the SQL statement; the driver's message is what matters.
    original = getattr(error, "orig", None)
    return str(original if original is not None else error) or type(error).__name__


def _is_missing_schema(error: exc.DBAPIError) -> bool:
    text = _driver_message(error).lower()
    return any(
        marker in text
        for marker in ("no such table", "does not exist", "doesn't exist", "undefinedtable")
    )


@contextmanager
def translate_errors(url: URL, *, connecting: bool = False) -> Iterator[None]:
    """Re-raise driver errors as StorageUnavailableError or StorageError; messages never hold the password.

    With `connecting`, any failure is "unavailable": a refused port, an unknown host, a missing
    database and bad credentials all mean the store cannot be reached as configured.
    """
    try:
        yield
    except StorageError:
        raise
    except exc.DBAPIError as error:
        if _is_missing_schema(error):
            raise StorageError(
                f"storage schema missing in {describe(url)}: run `python -m agent_async.storage.migrate`"
                f" ({_scrub(_driver_message(error), url)})"
            ) from error
        if connecting or error.connection_invalidated or isinstance(
            error, exc.OperationalError | exc.InterfaceError
        ):
            raise _unavailable(url, error) from error
        raise StorageError(
            f"storage query failed on {describe(url)}: {_scrub(_driver_message(error), url)}"
        ) from error
    except (OSError, TimeoutError, exc.InterfaceError) as error:
        raise _unavailable(url, error) from error
    except Exception as error:
        if connecting:
            raise _unavailable(url, error) from error
        raise


def _unavailable(url: URL, error: BaseException) -> StorageUnavailableError:
    logger.warning("storage %s unavailable: %s", describe(url), type(error).__name__)
    return StorageUnavailableError(
        f"storage database unavailable ({describe(url)}): {_scrub(_driver_message(error), url)}"
    )
