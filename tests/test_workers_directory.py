"""Live workers: each worker process registers at its heartbeat and drops out when it stops or dies."""

from __future__ import annotations

import asyncio
import os

from agent_async import Agent, AgentSettings, ClientAgent
from agent_async.store.workers import WorkerDirectory
from tests.conftest import running_worker
from tests.jobs import Echo  # noqa: F401  (a registered job, so a worker can start)


async def test_a_running_worker_is_listed_and_gone_after_it_stops(settings: AgentSettings, redis: object) -> None:
    async with Agent(settings) as agent:
        client = ClientAgent(agent)
        assert await client.workers() == []
        async with running_worker(agent):
            deadline = asyncio.get_running_loop().time() + 10
            while not (workers := await client.workers()):
                assert asyncio.get_running_loop().time() < deadline, "the worker never registered"
                await asyncio.sleep(0.02)
            [info] = workers
            assert info.pid == os.getpid() and info.jobs_running == 0 and info.heartbeat_ms >= info.started_ms
        assert await client.workers() == [], "a stopped worker unregisters"


async def test_a_dead_worker_expires(agent: Agent, client: ClientAgent) -> None:
    directory = WorkerDirectory(agent.job_store, ttl_ms=150)
    await directory.beat(2)
    [info] = await client.workers()
    assert info.worker_id == directory.worker_id and info.jobs_running == 2
    await asyncio.sleep(0.2)  # no heartbeat since: it died
    assert await client.workers() == []


async def test_a_beat_is_three_plain_commands(agent: Agent, redis: object) -> None:
    """Every idle worker beats every third of a lease: no MULTI/EXEC around its three writes."""
    from redis.asyncio import Redis

    assert isinstance(redis, Redis)
    directory = WorkerDirectory(agent.job_store, ttl_ms=5_000)

    async def calls() -> dict[str, int]:
        stats = await redis.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}

    before = await calls()
    await directory.beat(0)
    after = await calls()
    names = ("multi", "exec", "set", "zadd", "zremrangebyscore")
    grew = {name: after.get(name, 0) - before.get(name, 0) for name in names}
    assert grew == {"multi": 0, "exec": 0, "set": 1, "zadd": 1, "zremrangebyscore": 1}
    assert [info.worker_id for info in await ClientAgent(agent).workers()] == [directory.worker_id]
