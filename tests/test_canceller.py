"""JobCanceller: cancel a job whatever its state; a running one is flagged and waited for (bounded)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from agent_async import Agent, ClientAgent, JobRequest, JobStatus
from agent_async.canceller import JobCanceller
from agent_async.lifecycle import now_ms


@dataclass
class Gated(JobRequest):
    """One in flight per user: shows whether cancel frees the slot."""

    name: ClassVar[str] = "test_canceller.gated"
    max_concurrent: ClassVar[int] = 1


@pytest.fixture
def canceller(agent: Agent) -> JobCanceller:
    return JobCanceller(agent.job_store, engine_ref=agent.engine.ref, cancel_grace_s=0.1)


async def queued(redis: Redis, agent: Agent, job_id: str) -> bool:
    return await redis.zscore(agent.engine.names.queue, agent.engine.names.engine_job_id(job_id)) is not None


async def slots(agent: Agent, user: str = "u") -> int:
    return await agent.job_store.slots_held(agent.keys.gate(Gated.name, user))


@asynccontextmanager
async def cancel_channel(redis: Redis, agent: Agent) -> AsyncIterator[PubSub]:
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(agent.keys.cancel_channel)
    try:
        yield pubsub
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def next_message(pubsub: PubSub, timeout_s: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = await pubsub.get_message(timeout=0.1)
        if message is not None:
            return message["data"]
    return None


async def started(client: ClientAgent, agent: Agent) -> str:
    job_id = await client.enqueue(Gated(), "u")
    assert (await agent.job_store.start(job_id)).run
    return job_id


# -- unknown and not started -----------------------------------------------------------------------


async def test_unknown_job_is_none(canceller: JobCanceller, agent: Agent, redis: Redis) -> None:
    assert await canceller.cancel("never-existed") is None
    assert await canceller.cancel("never-existed", wait_s=0) is None
    assert not await redis.exists(agent.keys.state("never-existed")), "nothing is written for it"


async def test_pending_job_is_canceled_at_once_and_unqueued(
    canceller: JobCanceller, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    job_id = await client.enqueue(Gated(), "u")
    ref = agent.engine.ref(job_id)
    assert await queued(redis, agent, job_id) and await redis.exists(ref.job_key)
    assert await slots(agent) == 1
    t0 = time.monotonic()
    state = await canceller.cancel(job_id)
    assert time.monotonic() - t0 < 0.5, "no wait for a job that never started"
    assert state is not None and state.status is JobStatus.CANCELED
    assert state.error == "canceled before it started"
    assert state.attempts == 0 and state.started_ms is None and state.finished_ms is not None
    assert not await queued(redis, agent, job_id), "out of the engine's queue"
    assert not await redis.exists(ref.job_key)
    assert await slots(agent) == 0, "gate slot freed"
    assert await redis.zscore(agent.keys.active_index, job_id) is None
    assert await redis.ttl(agent.keys.state(job_id)) > 0, "kept for the retention only"
    # The freed slot takes a new job of the same user.
    await client.enqueue(Gated(), "u")


async def test_deferred_job_is_canceled_and_unqueued(
    canceller: JobCanceller, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    job_id = await client.enqueue(Gated(), "u", defer_s=60)
    assert await queued(redis, agent, job_id)
    state = await canceller.cancel(job_id)
    assert state is not None and state.status is JobStatus.CANCELED
    assert not await queued(redis, agent, job_id)
    assert await slots(agent) == 0


async def test_job_waiting_for_a_retry_is_canceled_at_once(
    canceller: JobCanceller, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    job_id = await started(client, agent)
    assert await agent.job_store.transition(job_id, JobStatus.RETRY, error="ValueError: flaky")
    state = await canceller.cancel(job_id, wait_s=5)
    assert state is not None and state.status is JobStatus.CANCELED
    assert state.attempts == 1
    assert not await queued(redis, agent, job_id)
    assert await slots(agent) == 0
    assert await redis.zscore(agent.keys.leases, job_id) is None


# -- terminal --------------------------------------------------------------------------------------


async def test_finished_job_is_returned_unchanged(
    canceller: JobCanceller, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    job_id = await started(client, agent)
    assert await agent.job_store.transition(job_id, JobStatus.SUCCESS, result={"n": 1})
    before = await agent.job_store.get(job_id)
    async with cancel_channel(redis, agent) as pubsub:
        state = await canceller.cancel(job_id)
        assert await next_message(pubsub, timeout_s=0.3) is None, "nothing to announce"
    assert state == before
    assert state is not None and state.status is JobStatus.SUCCESS and state.result == {"n": 1}
    assert await redis.hget(agent.keys.state(job_id), "cancel_requested_ms") is None


async def test_cancel_is_idempotent(canceller: JobCanceller, agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Gated(), "u")
    first = await canceller.cancel(job_id)
    second = await canceller.cancel(job_id)
    assert first is not None and first.status is JobStatus.CANCELED
    assert second == first


# -- running ---------------------------------------------------------------------------------------


async def test_running_job_with_no_wait_is_flagged_and_announced(
    canceller: JobCanceller, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    job_id = await started(client, agent)
    async with cancel_channel(redis, agent) as pubsub:
        t0 = time.monotonic()
        before_ms = now_ms()
        state = await canceller.cancel(job_id, wait_s=0)
        elapsed_s = time.monotonic() - t0
        assert await next_message(pubsub) == job_id.encode()
    assert state is not None and state.status is JobStatus.STARTED
    assert elapsed_s < 0.5
    flag = await redis.hget(agent.keys.state(job_id), "cancel_requested_ms")
    assert flag is not None and before_ms <= int(flag) <= now_ms()
    # Still running: its lease, slot and queue entry are the worker's to release.
    assert await redis.zscore(agent.keys.leases, job_id) is not None
    assert await slots(agent) == 1


async def test_running_job_nobody_stops_is_waited_for_a_bounded_time(
    canceller: JobCanceller, agent: Agent, client: ClientAgent
) -> None:
    job_id = await started(client, agent)
    wait_s = 0.3
    t0 = time.monotonic()
    state = await canceller.cancel(job_id, wait_s=wait_s)
    elapsed_s = time.monotonic() - t0
    assert state is not None and state.status is JobStatus.STARTED
    assert wait_s <= elapsed_s < wait_s + 0.5


async def test_running_job_stopped_during_the_wait_is_returned_canceled(
    canceller: JobCanceller, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """A stand-in worker hears the cancel and ends the job: the canceller returns as soon as it sees it."""
    job_id = await started(client, agent)
    async with cancel_channel(redis, agent) as pubsub:

        async def worker() -> None:
            assert await next_message(pubsub, timeout_s=5) == job_id.encode()
            await agent.job_store.transition(job_id, JobStatus.CANCELED, error="canceled while running (test)")

        stopper = asyncio.create_task(worker())
        t0 = time.monotonic()
        state = await canceller.cancel(job_id, wait_s=10)
        elapsed_s = time.monotonic() - t0
        await stopper
    assert state is not None and state.status is JobStatus.CANCELED
    assert state.error == "canceled while running (test)"
    assert elapsed_s < 2, "returned when the job ended, not at the end of the wait"
    assert await slots(agent) == 0


async def test_default_wait_sees_a_job_stopped_by_its_worker(
    canceller: JobCanceller, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """wait_s=None waits (for the grace plus a margin) rather than returning at once."""
    job_id = await started(client, agent)
    async with cancel_channel(redis, agent) as pubsub:

        async def worker() -> None:
            assert await next_message(pubsub, timeout_s=5) == job_id.encode()
            await asyncio.sleep(0.2)  # the job's clean-up takes a while
            await agent.job_store.transition(job_id, JobStatus.CANCELED, error="canceled while running (test)")

        stopper = asyncio.create_task(worker())
        state = await canceller.cancel(job_id)
        await stopper
    assert state is not None and state.status is JobStatus.CANCELED


async def test_job_state_gone_during_the_wait_is_none(
    canceller: JobCanceller, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    job_id = await started(client, agent)
    async with cancel_channel(redis, agent) as pubsub:

        async def expire() -> None:
            assert await next_message(pubsub, timeout_s=5) == job_id.encode()
            await redis.delete(agent.keys.state(job_id))

        vanisher = asyncio.create_task(expire())
        state = await canceller.cancel(job_id, wait_s=5)
        await vanisher
    assert state is None


async def test_cancel_of_a_canceled_running_job_is_not_announced_again(
    canceller: JobCanceller, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """Once the worker has ended it CANCELED, a repeated cancel is a no-op."""
    job_id = await started(client, agent)
    await canceller.cancel(job_id, wait_s=0)
    assert await agent.job_store.transition(job_id, JobStatus.CANCELED, error="canceled while running (test)")
    async with cancel_channel(redis, agent) as pubsub:
        state = await canceller.cancel(job_id)
        assert await next_message(pubsub, timeout_s=0.3) is None
    assert state is not None and state.status is JobStatus.CANCELED
