"""ClientAgent.enqueue_once: one job per idempotency key, whatever the number of calls (a client's
retry of a request whose answer it never saw), on the real Redis."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from agent_async import Agent, ClientAgent, JobStatus, keyed_job_id, testing
from agent_async.errors import RequestCode, RequestRefusedError
from tests.jobs import Echo, Gated, runs_key


async def _queued(agent: Agent, redis: Redis) -> int:
    return int(await redis.zcard(agent.engine.names.queue))


async def test_the_same_key_gets_the_same_job_and_it_runs_once(
    agent: Agent, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    first = await client.enqueue_once(Echo(text="a"), "u1", key="order-17")
    again = await client.enqueue_once(Echo(text="a"), "u1", key="order-17")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.job_id == first.job_id == keyed_job_id(Echo.name, "u1", "order-17")
    assert await _queued(agent, redis) == 1
    await testing.drain(agent)
    after = await client.enqueue_once(Echo(text="a"), "u1", key="order-17")  # its state is kept: still its job
    assert after == again
    state = await client.get_state(first.job_id)
    assert state is not None and state.status is JobStatus.SUCCESS
    assert await redis.hget(runs_key(namespace), first.job_id) == b"1"
    assert await _queued(agent, redis) == 0


async def test_calls_sent_together_make_one_job(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    answers = await asyncio.gather(*(client.enqueue_once(Echo(text="a"), "u1", key="k") for _ in range(8)))
    assert len({a.job_id for a in answers}) == 1
    assert sorted(a.replayed for a in answers) == [False] + [True] * 7
    assert await _queued(agent, redis) == 1


async def test_a_key_reused_for_another_payload_is_refused_and_writes_nothing(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    first = await client.enqueue_once(Echo(text="a"), "u1", key="k")
    with pytest.raises(RequestRefusedError) as refused:
        await client.enqueue_once(Echo(text="b"), "u1", key="k")
    assert refused.value.code is RequestCode.IDEMPOTENCY_KEY_REUSED
    state = await client.get_state(first.job_id)
    assert state is not None and state.payload["text"] == "a", "the first job is left as it was"
    assert await _queued(agent, redis) == 1


async def test_a_key_names_a_job_per_user_and_per_kind_of_job(client: ClientAgent) -> None:
    mine = await client.enqueue_once(Echo(text="a"), "u1", key="k")
    theirs = await client.enqueue_once(Echo(text="a"), "u2", key="k")
    system = await client.enqueue_once(Echo(text="a"), key="k")
    gated = await client.enqueue_once(Gated(), "u1", key="k")
    assert len({mine.job_id, theirs.job_id, system.job_id, gated.job_id}) == 4
    assert not any(a.replayed for a in (mine, theirs, system, gated))
    state = await client.get_state(theirs.job_id)
    assert state is not None and state.user_uid == "u2"


@pytest.mark.parametrize("key", ["", "x" * 256])
async def test_an_empty_or_overlong_key_is_refused(agent: Agent, client: ClientAgent, redis: Redis, key: str) -> None:
    with pytest.raises(RequestRefusedError) as refused:
        await client.enqueue_once(Echo(), key=key)
    assert refused.value.code is RequestCode.IDEMPOTENCY_KEY_INVALID
    assert await _queued(agent, redis) == 0


async def test_a_call_refused_by_the_gate_leaves_the_key_free(agent: Agent, client: ClientAgent) -> None:
    """A refusal writes nothing: once the slot is free, the same key queues the job."""
    holder = await client.enqueue(Gated(), "u1")
    with pytest.raises(RequestRefusedError) as refused:
        await client.enqueue_once(Gated(), "u1", key="k")
    assert refused.value.code is RequestCode.JOB_CONCURRENT_LIMIT
    assert await client.get_state(keyed_job_id(Gated.name, "u1", "k")) is None
    await testing.drain(agent)
    assert (state := await client.get_state(holder)) is not None and state.status is JobStatus.SUCCESS
    later = await client.enqueue_once(Gated(), "u1", key="k")
    assert not later.replayed and later.job_id == keyed_job_id(Gated.name, "u1", "k")
