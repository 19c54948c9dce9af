"""Two namespaces on one Redis never see each other's jobs, states or workers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, JobStatus
from tests.conftest import Drain, run_burst
from tests.jobs import Echo


@pytest.fixture
async def other_agent(settings: AgentSettings, redis: Redis) -> AsyncIterator[Agent]:
    other_ns = f"t-{uuid.uuid4().hex[:12]}"
    async with Agent(settings.with_namespace(other_ns)) as agent:
        yield agent
    keys = [k async for k in redis.scan_iter(match=f"*{other_ns}*")]
    if keys:
        await redis.delete(*keys)


async def test_worker_runs_only_its_namespace(drain: Drain, agent: Agent, other_agent: Agent) -> None:
    mine = await ClientAgent(agent).enqueue(Echo(text="mine"), "u")
    theirs = await ClientAgent(other_agent).enqueue(Echo(text="theirs"), "u")
    assert mine != theirs
    await drain()
    assert (await agent.job_store.get(mine)).status is JobStatus.SUCCESS  # type: ignore[union-attr]
    assert (await other_agent.job_store.get(theirs)).status is JobStatus.PENDING  # type: ignore[union-attr]
    # States and indexes are invisible across namespaces.
    assert await agent.job_store.get(theirs) is None
    assert [s.job_id for s in await ClientAgent(agent).list_for_user("u")] == [mine]
    await run_burst(other_agent)
    assert (await other_agent.job_store.get(theirs)).status is JobStatus.SUCCESS  # type: ignore[union-attr]


async def test_engine_keys_carry_the_namespace(agent: Agent, redis: Redis) -> None:
    """arq's global per-job keys are made distinct by the namespaced engine job id."""
    job_id = await ClientAgent(agent).enqueue(Echo())
    assert await redis.exists(f"arq:job:{agent.keys.namespace}:{job_id}")
    assert await redis.zrange(agent.engine.names.queue, 0, -1) == [f"{agent.keys.namespace}:{job_id}".encode()]
