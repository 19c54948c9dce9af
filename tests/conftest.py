"""Shared fixtures: real Redis, one namespace per test, an Agent and a ClientAgent on it."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from arq.worker import Worker
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, JobState, JobStatus, registry
from agent_async.registry import JobRegistry

REDIS_URL = os.environ.get("AGENT_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


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
    with registry.scoped() as scoped:
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


@asynccontextmanager
async def running_worker(agent: Agent, **overrides: Any) -> AsyncIterator[asyncio.Task[None]]:
    """A worker serving in the background for the duration of the block."""
    task = asyncio.create_task(agent.run_worker(poll_delay=0.005, **overrides))
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_for_status(agent: Agent, job_id: str, *statuses: JobStatus, timeout_s: float = 10) -> JobState:
    """Poll a state until it has one of `statuses` (bounded: fails after `timeout_s`)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        state = await agent.job_store.get(job_id)
        if state is not None and state.status in statuses:
            return state
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"job {job_id} did not reach {statuses} within {timeout_s}s: {state}")
        await asyncio.sleep(0.02)


async def run_burst(agent: Agent, kind: str = "agent_worker") -> None:
    if kind == "agent_worker":
        await agent.run_worker(burst=True, poll_delay=0)
        return
    worker = Worker(**agent.worker_settings(burst=True, poll_delay=0, handle_signals=False))
    try:
        await worker.main()
    finally:
        await worker.close()
