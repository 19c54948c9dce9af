"""The real SQL servers of the tests: their URLs, and one throw-away migrated database per session."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import NoReturn

import pytest
from sqlalchemy.engine import URL, make_url

from agent_async.storage.testing import scratch_database

BACKENDS = ("sqlite", "postgresql", "mariadb")
SERVER_URLS = {
    "postgresql": ("AGENT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    "mariadb": ("AGENT_TEST_MARIADB_URL", "mysql+aiomysql://root@127.0.0.1:3306/test"),
}


def server_url(backend: str) -> str:
    var, default = SERVER_URLS[backend]
    return os.environ.get(var, default)


def unreachable(backend: str, url: str, error: BaseException) -> NoReturn:
    """Skip the test, or fail it under CI=true, where the real databases are required."""
    reason = f"{backend} unreachable at {make_url(url).render_as_string()}: {error!r}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: real databases are required)")
    pytest.skip(reason)


def scratch_server_database(backend: str) -> Iterator[URL]:
    """A fresh migrated database on the backend's server for a session fixture; dropped after it."""
    url_of_server = server_url(backend)
    runner = asyncio.Runner()
    manager = scratch_database(url_of_server)
    try:
        url = runner.run(manager.__aenter__())
    except Exception as error:
        runner.close()
        unreachable(backend, url_of_server, error)
    try:
        yield url
    finally:
        runner.run(manager.__aexit__(None, None, None))
        runner.close()
