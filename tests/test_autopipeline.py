"""Concurrent callers' commands share round trips (agent_async.store.autopipeline), on the real Redis."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from agent_async import Agent, ClientAgent, JobStatus
from agent_async.errors import QueueUnavailableError
from agent_async.store.autopipeline import MAX_BATCH, AutoPipeline
from tests.faults.conftest import free_port
from tests.jobs import Echo


async def test_concurrent_reads_go_out_together_and_each_gets_its_own_state(
    agent: Agent, client: ClientAgent
) -> None:
    ids = [await client.enqueue(Echo(text=str(i))) for i in range(20)]
    stats = agent.job_store.pipeline.stats
    sends_before, reads_before = stats.sends, stats.commands
    states = await asyncio.gather(*(client.get_state(job_id) for job_id in ids))
    assert [s.job_id if s else None for s in states] == ids
    assert all(s is not None and s.status is JobStatus.PENDING for s in states)
    assert [s.payload["text"] for s in states if s] == [str(i) for i in range(20)]
    assert stats.commands - reads_before == 20
    # The first goes out alone, the 19 that came while it was in flight in one pipeline.
    assert stats.sends - sends_before == 2
    assert stats.largest == 19


async def test_reads_one_after_another_each_go_out_alone(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Echo())
    stats = agent.job_store.pipeline.stats
    sends_before = stats.sends
    for _ in range(5):
        state = await client.get_state(job_id)
        assert state is not None and state.job_id == job_id
    assert await client.get_state("no-such-job") is None
    assert stats.sends - sends_before == 6


async def test_a_batch_is_capped_and_the_rest_follows(redis: Redis, namespace: str) -> None:
    key = f"{namespace}:h"
    await redis.hset(key, mapping={"f": "v"})
    reads = AutoPipeline(lambda: redis)
    count = 1 + 2 * MAX_BATCH + 1
    replies = await asyncio.gather(*(reads.hgetall(key) for _ in range(count)))
    assert replies == [{b"f": b"v"}] * count
    assert reads.stats.largest == MAX_BATCH
    assert reads.stats.sends == 1 + 2 + 1  # alone, two full batches, the one left


async def test_one_reads_error_is_its_own(redis: Redis, namespace: str) -> None:
    """A key of the wrong type fails its reader alone; the others of the same pipeline get their answers."""
    good, bad = f"{namespace}:good", f"{namespace}:bad"
    await redis.hset(good, mapping={"f": "v"})
    await redis.set(bad, "a string")
    reads = AutoPipeline(lambda: redis)
    replies = await asyncio.gather(
        reads.hgetall(good), reads.hgetall(good), reads.hgetall(bad), reads.hgetall(good),
        return_exceptions=True,
    )
    assert replies[0] == replies[1] == replies[3] == {b"f": b"v"}
    assert isinstance(replies[2], ResponseError) and "WRONGTYPE" in str(replies[2])
    assert reads.stats.largest == 3


async def test_unreachable_redis_fails_every_reader_and_reads_resume_after(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Echo())
    store = agent.job_store
    reachable = store.redis
    dead = Redis(host="127.0.0.1", port=free_port())  # nothing listens there
    store.bind(dead)
    try:
        outcomes = await asyncio.gather(*(client.get_state(job_id) for _ in range(5)), return_exceptions=True)
    finally:
        store.bind(reachable)
        await dead.aclose()
    assert all(isinstance(o, QueueUnavailableError) for o in outcomes), outcomes
    assert all("Redis is unreachable" in str(o) for o in outcomes)
    # Nothing is left waiting or marked in flight: the next reads go out and answer.
    states = await asyncio.gather(*(client.get_state(job_id) for _ in range(3)))
    assert all(s is not None and s.job_id == job_id for s in states)


async def test_cancelled_readers_leave_the_others_their_answers(redis: Redis, namespace: str) -> None:
    key = f"{namespace}:h"
    await redis.hset(key, mapping={"f": "v"})
    reads = AutoPipeline(lambda: redis)
    tasks = [asyncio.create_task(reads.hgetall(key)) for _ in range(6)]
    await asyncio.sleep(0)  # the first is in flight alone, the other five wait for it
    tasks[0].cancel()  # the one in flight
    tasks[3].cancel()  # one that waits
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError) and isinstance(done[3], asyncio.CancelledError)
    assert [done[i] for i in (1, 2, 4, 5)] == [{b"f": b"v"}] * 4
    # The four left went out together once the first gave up; nothing is stuck in flight.
    assert reads.stats.largest == 4
    assert await reads.hgetall(key) == {b"f": b"v"}
    assert reads.stats.sends == 3


@pytest.mark.parametrize("leader_cancelled", [False, True])
async def test_a_reader_joining_after_a_batch_left_waits_for_the_next(
    redis: Redis, namespace: str, leader_cancelled: bool
) -> None:
    key = f"{namespace}:h"
    await redis.hset(key, mapping={"f": "v"})
    reads = AutoPipeline(lambda: redis)
    first = asyncio.create_task(reads.hgetall(key))
    await asyncio.sleep(0)
    second = asyncio.create_task(reads.hgetall(key))
    await asyncio.sleep(0)
    if leader_cancelled:
        first.cancel()
    late = asyncio.create_task(reads.hgetall(key))
    assert await second == {b"f": b"v"}
    assert await late == {b"f": b"v"}
    if not leader_cancelled:
        assert await first == {b"f": b"v"}
