"""ClientAgent.enqueue_many: one round trip per batch, each job with its own gate check and
atomicity; the result says which were queued and which refused, and why."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from agent_async import (
    Agent,
    AgentSettings,
    BatchEnqueueError,
    ClientAgent,
    JobStatus,
    QueueUnavailableError,
    RequestCode,
)
from agent_async.client import EnqueueResult
from tests.conftest import Drain
from tests.faults.conftest import PrivateRedis
from tests.jobs import Echo, Gated, GatedFive, runs_key


async def test_every_job_is_queued_and_runs(client: ClientAgent, drain: Drain, redis: Redis, namespace: str) -> None:
    results = await client.enqueue_many([Echo(text=str(i)) for i in range(30)], user_uid="alice")
    assert len(results) == 30 and all(r.accepted and r.code is None for r in results)
    ids = [r.job_id for r in results]
    assert len(set(ids)) == 30
    states = [await client.get_state(job_id) for job_id in ids if job_id]
    assert all(s is not None and s.status is JobStatus.PENDING and s.user_uid == "alice" for s in states)
    assert await client.count_for_user("alice") == 30
    await drain()
    for job_id in ids:
        state = await client.get_state(job_id or "")
        assert state is not None and state.status is JobStatus.SUCCESS
    # Each ran once (only ours are counted: a cron tick of the test registry may run in the drain).
    runs = await redis.hmget(runs_key(namespace), [job_id or "" for job_id in ids])
    assert [int(n or 0) for n in runs] == [1] * 30


async def test_each_job_keeps_its_own_gate_check(client: ClientAgent, agent: Agent) -> None:
    """One slot for Gated, five for GatedFive: the batch takes what is free, in order, and the
    refused ones write nothing (no state, no slot)."""
    batch = [Gated(), GatedFive(), Gated(), *[GatedFive() for _ in range(5)]]
    results = await client.enqueue_many(batch, user_uid="bob")
    accepted = [r.accepted for r in results]
    assert accepted == [True, True, False, True, True, True, True, False]
    for refused in (results[2], results[7]):
        assert refused.job_id is None and refused.code is RequestCode.JOB_CONCURRENT_LIMIT
        assert "already in flight" in refused.reason
    assert await agent.job_store.slots_held(agent.keys.gate(Gated.name, "bob")) == 1
    assert await agent.job_store.slots_held(agent.keys.gate(GatedFive.name, "bob")) == 5
    assert await client.count_for_user("bob") == 6


async def test_an_invalid_payload_is_refused_alone(client: ClientAgent) -> None:
    results = await client.enqueue_many([Echo(text="ok"), Echo(numbers=[object()]), Echo(text="ok too")])  # type: ignore[list-item]
    assert [r.accepted for r in results] == [True, False, True]
    assert results[1] == EnqueueResult(None, RequestCode.JOB_PAYLOAD_INVALID, results[1].reason)
    assert results[1].reason


async def test_an_empty_batch_asks_nothing(client: ClientAgent) -> None:
    assert await client.enqueue_many([]) == []


async def command_calls(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


async def test_one_script_call_per_batch_and_scripts_lost_by_redis_are_sent_again(
    private_redis: PrivateRedis, namespace: str
) -> None:
    async with Agent(AgentSettings(redis_url=private_redis.url, namespace=namespace)) as agent:
        client = ClientAgent(agent)
        redis = agent.job_store.redis
        await redis.script_flush()  # as after a Redis restart: the enqueue script is gone
        before = await command_calls(redis)
        results = await client.enqueue_many([Echo(text=str(i)) for i in range(20)])
        after = await command_calls(redis)
        assert all(r.accepted for r in results)
        assert await redis.zcard(agent.engine.names.queue) == 20
        # One call that found the script missing, its reload, then one more for all 20.
        assert after["evalsha"] - before.get("evalsha", 0) == 2
        assert after["script|load"] - before.get("script|load", 0) == 1
        before = await command_calls(redis)
        await client.enqueue_many([Echo(text=str(i)) for i in range(20)])
        after = await command_calls(redis)
        assert after["evalsha"] - before["evalsha"] == 1
        # 20 jobs, one batch: their wake-up tokens in one push (not one per job).
        assert after["lpush"] - before["lpush"] == 1


async def test_batches_keep_the_order_and_every_job(
    client: ClientAgent, agent: Agent, redis: Redis
) -> None:
    """More than one batch (100 jobs each): built while the one before is in flight, sent in turn."""
    await client.enqueue_many([Echo(text="loads the script")])
    before = await command_calls(redis)
    requests = [Echo(text=str(i)) for i in range(1203)]
    results = await client.enqueue_many(requests, user_uid="carol")
    after = await command_calls(redis)
    assert after["evalsha"] - before["evalsha"] == 13
    ids = [r.job_id or "" for r in results]
    assert all(ids) and len(set(ids)) == 1203
    states = await agent.job_store.get_many(ids)
    assert [s.payload["text"] if s else None for s in states] == [str(i) for i in range(1203)]
    assert await client.count_for_user("carol") == 1203
    assert await redis.zcard(agent.engine.names.queue) == 1204


async def test_a_job_redis_refuses_stops_the_batch_and_says_which_were_queued(
    client: ClientAgent, agent: Agent, redis: Redis
) -> None:
    """A key of the wrong type (the name index of one job type): the jobs before that job are
    queued, the error says which; it and every job after it (of any type) wrote nothing."""
    await redis.set(agent.keys.name_index(GatedFive.name), "not a zset")
    batch: list[Echo | GatedFive] = [Echo(text="a"), Echo(text="b"), GatedFive(), Echo(text="c")]
    with pytest.raises(BatchEnqueueError, match="wrong type") as caught:
        await client.enqueue_many(batch, user_uid="dave")
    queued = caught.value.results
    assert len(queued) == 2 and all(r.accepted for r in queued)
    assert await client.count_for_user("dave") == 2
    assert await redis.zcard(agent.engine.names.queue) == 2
    assert await agent.job_store.slots_held(agent.keys.gate(GatedFive.name, "dave")) == 0
    states = await agent.job_store.get_many([r.job_id or "" for r in queued])
    assert [s.payload["text"] if s else None for s in states] == ["a", "b"]


async def test_redis_down_is_queue_unavailable(private_redis: PrivateRedis, namespace: str) -> None:
    async with Agent(AgentSettings(redis_url=private_redis.url, namespace=namespace)) as agent:
        private_redis.stop()
        with pytest.raises(QueueUnavailableError):
            await ClientAgent(agent).enqueue_many([Echo(text="x")])
