"""Fixtures of the app suite: a migrated database (SQLite always, PostgreSQL when reachable), the app
on real Redis in its own namespace, and a test client that drains the queue with a real worker."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from quart import Quart
from quart.testing import QuartClient
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from agent_async import AgentSettings, JobState
from app.auth import TokenSigner
from app.factory import create_app
from app.migrate import upgrade
from app.runtime import EXTENSION_KEY, AppRuntime
from app.settings import AppSettings
from tests.conftest import REDIS_URL

SECRET = "test-secret-key-0123456789abcdef"
MAX_BODY_BYTES = 256 * 1024
PG_ADMIN_URL = os.environ.get("AGENT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")


async def _pg_admin(statement: str) -> None:
    engine = create_async_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('appdb') / 'app.db'}"
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def postgresql_url() -> Iterator[str]:
    """A throw-away PostgreSQL database migrated with the real migrations, dropped after the session."""
    name = f"app_test_{uuid.uuid4().hex[:12]}"
    try:
        asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI but unreachable at {PG_ADMIN_URL}: {exc}")
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_URL}: {exc}")
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Every end-to-end test runs on SQLite and on PostgreSQL."""
    return str(request.getfixturevalue(f"{request.param}_url"))


def make_settings(database_url: str, namespace: str, **agent: Any) -> AppSettings:
    return AppSettings(
        agent=AgentSettings(
            redis_url=agent.pop("redis_url", REDIS_URL),
            namespace=namespace,
            database_url=database_url,
            retry_backoff_base_s=0.01,
            retry_backoff_max_s=0.05,
            reconcile_interval_s=0.2,
            **agent,
        ),
        secret_key=SECRET,
        max_body_bytes=MAX_BODY_BYTES,
    )


@dataclass
class Api:
    """The test client plus what tests need around it: tokens, the runtime and a worker drain."""

    app: Quart
    client: QuartClient
    runtime: AppRuntime

    def headers(self, uid: str, *, admin: bool = False) -> dict[str, str]:
        token = TokenSigner(SECRET, max_age_s=60).issue(uid, admin=admin)
        return {"Authorization": f"Bearer {token}"}

    async def drain(self) -> None:
        """Run a real worker until the queue is empty (arq burst mode): deterministic, no sleeps, and
        no cron ticks (a drain across a 5-minute boundary would queue the sweep schedule's run)."""
        await self.runtime.agent.run_worker(burst=True, poll_delay=0, handle_signals=False, cron_jobs=[])

    async def state(self, job_id: str) -> JobState:
        state = await self.runtime.client.get_state(job_id)
        if state is None:
            raise AssertionError(f"no state for job {job_id}")
        return state


@pytest.fixture
async def api(database_url: str, namespace: str, redis: Redis) -> AsyncIterator[Api]:
    """The app served in-process (lifespan run) on real Redis and the parametrized database."""
    app = create_app(make_settings(database_url, namespace))
    async with app.test_app() as test_app:
        yield Api(app=app, client=test_app.test_client(), runtime=app.extensions[EXTENSION_KEY])


@pytest.fixture
def user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def other_user() -> str:
    return f"other-{uuid.uuid4().hex[:8]}"


def ics_with_events(count: int, *, prefix: str = "evt") -> str:
    """A valid ICS text with `count` events whose UIDs are stable (`<prefix>-<n>@test`)."""
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//tests//agent-async//EN"]
    for n in range(count):
        day = 1 + n % 28
        lines += [
            "BEGIN:VEVENT",
            f"UID:{prefix}-{n}@test",
            "DTSTAMP:20300101T000000Z",
            f"DTSTART:203002{day:02d}T{8 + n % 10:02d}0000Z",
            f"DTEND:203002{day:02d}T{9 + n % 10:02d}0000Z",
            f"SUMMARY:Event {n}",
            f"DESCRIPTION:Imported event number {n}",
            "END:VEVENT",
        ]
    lines.append("END:VCALENDAR")
    return "\r\n".join(lines) + "\r\n"


ROOT = Path(__file__).resolve().parents[2]
