"""Shared fixtures: real Redis, one namespace per test, an Agent and a ClientAgent on it."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, testing
from agent_async.registry import JobRegistry
from agent_async.testing import running_worker, scoped_registry, wait_for_status
from tests.faults.conftest import PrivateRedis

__all__ = ["REDIS_URL", "Drain", "run_burst", "running_worker", "wait_for_status"]

REDIS_URL = os.environ.get("AGENT_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture(autouse=True)
def _gc_unfrozen() -> Iterator[None]:
    """A test that runs a worker with AGENT_WORKER_GC_FREEZE on freezes the pytest process's
    objects: that would pin every earlier test's leftovers, so it is undone after each test."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of the test's own: its command counts, restarts and SCRIPT FLUSH touch no
    other test."""
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def namespace() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def settings(namespace: str, tmp_path: Path) -> AgentSettings:
    return AgentSettings(
        redis_url=REDIS_URL,
        namespace=namespace,
        # Blob store and schedule overrides: a file of the test's own (migrated where a test needs it).
        database_url=f"sqlite+aiosqlite:///{tmp_path}/agent.db",
        retry_backoff_base_s=0.01,
        retry_backoff_max_s=0.05,
        hard_timeout_grace_s=0.5,
        cancel_grace_s=0.5,
        reconcile_interval_s=0.2,
    )


@pytest.fixture
async def redis(namespace: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except Exception as exc:  # pragma: no cover - environment problem, not a test result
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: {exc}")
    yield client
    # Everything this test wrote: our namespace and arq's per-job keys of our engine job ids.
    for pattern in (f"{namespace}:*", f"arq:*:{namespace}:*"):
        keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
        if keys:
            await client.delete(*keys)
    await client.zremrangebylex("arq:abort", f"[{namespace}:", f"[{namespace}:\xff")
    await client.aclose()


@pytest.fixture
def job_registry() -> Iterator[JobRegistry]:
    """Jobs declared inside a test are forgotten after it."""
    with scoped_registry() as scoped:
        yield scoped


@pytest.fixture
async def agent(settings: AgentSettings, redis: Redis, job_registry: JobRegistry) -> AsyncIterator[Agent]:
    async with Agent(settings) as opened:
        yield opened


@pytest.fixture
def client(agent: Agent) -> ClientAgent:
    return ClientAgent(agent)


Drain = Callable[[], Awaitable[None]]


@pytest.fixture(params=["agent_worker", "arq_cli_worker"])
def drain(request: pytest.FixtureRequest, agent: Agent) -> Drain:
    """Run a worker until the queue is empty (arq burst mode): deterministic, no sleeps.

    Each test using it runs twice: with Agent.run_worker (outcomes committed inside arq's finish
    transaction) and with the plain arq Worker that `arq app.worker.WorkerSettings` builds
    (outcomes written by the hooks).
    """

    return lambda: run_burst(agent, request.param)


async def run_burst(agent: Agent, kind: str = "agent_worker") -> None:
    await testing.drain(agent, stock_worker=kind == "arq_cli_worker")
