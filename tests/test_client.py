"""ClientAgent: atomic enqueue, clear errors for bad requests, cancel before start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis

from agent_async import (
    ERROR_JOB_PAYLOAD_INVALID,
    ERROR_JOB_UNKNOWN,
    Agent,
    AgentSettings,
    ClientAgent,
    EnqueueError,
    JobRequest,
    JobStatus,
    QueueUnavailableError,
    RequestException,
)
from tests.conftest import Drain, run_burst
from tests.jobs import Echo, Gated, runs_key


async def namespace_keys(redis: Redis, agent: Agent) -> list[bytes]:
    return sorted([k async for k in redis.scan_iter(match=f"{agent.keys.namespace}:*")])


async def test_enqueue_that_fails_in_redis_writes_nothing(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """Inject a failure at the engine step (queue key of the wrong type): no state, no slot, no index."""
    await redis.set(agent.engine.names.queue, "not a sorted set")
    with pytest.raises(EnqueueError, match="wrong type"):
        await client.enqueue(Gated(), "u")
    assert await namespace_keys(redis, agent) == [agent.engine.names.queue.encode()]
    await redis.delete(agent.engine.names.queue)
    # Nothing held: the same user can enqueue at once.
    job_id = await client.enqueue(Gated(), "u")
    assert (await client.get_state(job_id)).status is JobStatus.PENDING  # type: ignore[union-attr]


@pytest.mark.parametrize("index", ["user", "name", "all", "active"])
async def test_enqueue_with_an_index_of_the_wrong_type_writes_nothing(
    agent: Agent, client: ClientAgent, redis: Redis, index: str
) -> None:
    """An index written by the enqueue holds something else: the enqueue is refused with a clear
    error, and the indexes written before it are undone (no state, no entry, nothing queued)."""
    keys = agent.keys
    key = {"user": keys.user_index("u"), "name": keys.name_index(Gated.name), "all": keys.all_index,
           "active": keys.active_index}[index]
    await redis.set(key, "not a sorted set")
    with pytest.raises(EnqueueError, match="wrong type"):
        await client.enqueue(Gated(), "u")
    assert await namespace_keys(redis, agent) == [key.encode()]
    await redis.delete(key)
    job_id = await client.enqueue(Gated(), "u")
    assert (await client.get_state(job_id)).status is JobStatus.PENDING  # type: ignore[union-attr]


async def test_enqueue_with_redis_unreachable_raises_enqueue_error(settings: AgentSettings) -> None:
    """A Redis that cannot be reached gives QueueUnavailableError (the API turns it into 503)."""
    unreachable = AgentSettings(redis_url="redis://127.0.0.1:1/0", namespace=settings.namespace)
    async with Agent(unreachable) as agent:
        with pytest.raises(QueueUnavailableError, match="Redis is unreachable"):
            await ClientAgent(agent).enqueue(Echo())
        with pytest.raises(QueueUnavailableError):
            await ClientAgent(agent).get_state("any")


async def test_duplicate_job_id_is_refused(agent: Agent) -> None:
    state = await agent.create_job(Echo(text="one"), job_id="fixed-id")
    with pytest.raises(EnqueueError, match="already exists"):
        await agent.create_job(Echo(text="two"), job_id=state.job_id)
    stored = await agent.job_store.get("fixed-id")
    assert stored is not None and stored.payload["text"] == "one"


async def test_unknown_job_name_is_a_clear_error(client: ClientAgent) -> None:
    with pytest.raises(RequestException) as caught:
        await client.enqueue_named("no.such.job", {})
    assert caught.value.code == ERROR_JOB_UNKNOWN
    assert "no.such.job" in caught.value.message


async def test_enqueue_named_rebuilds_the_request(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue_named("tests.echo", {"text": "by name", "numbers": [4]}, "u")
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.result == {"echo": "by name", "sum": 4, "user": "u"}


async def test_enqueue_named_with_unknown_field_is_refused(client: ClientAgent, agent: Agent, redis: Redis) -> None:
    with pytest.raises(RequestException) as caught:
        await client.enqueue_named("tests.echo", {"text": "x", "evil": 1})
    assert caught.value.code == ERROR_JOB_PAYLOAD_INVALID
    assert "evil" in caught.value.message
    assert await namespace_keys(redis, agent) == []


@dataclass
class Loose(JobRequest):
    name: ClassVar[str] = "tests.loose"
    value: Any = None


async def test_payload_value_that_is_not_json_is_refused_before_any_write(
    client: ClientAgent, agent: Agent, redis: Redis
) -> None:
    for bad in (object(), float("nan"), {1: "int key"}, (1, 2), b"bytes"):
        with pytest.raises(RequestException) as caught:
            await client.enqueue(Loose(value=bad))
        assert caught.value.code == ERROR_JOB_PAYLOAD_INVALID
        assert "Loose" in caught.value.message
    assert await namespace_keys(redis, agent) == []


async def test_cancel_queued_job_never_runs(drain: Drain, agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """Cancel before start: CANCELED, out of arq's queue, never run, even by a later worker."""
    job_id = await client.enqueue(Echo(text="never"), "u")
    state = await client.cancel(job_id)
    assert state is not None and state.status is JobStatus.CANCELED
    assert await redis.zcard(agent.engine.names.queue) == 0
    await drain()
    assert await redis.hget(runs_key(agent.keys.namespace), job_id) is None
    assert (await client.get_state(job_id)).status is JobStatus.CANCELED  # type: ignore[union-attr]


async def test_cancel_is_idempotent_and_leaves_terminal_jobs_alone(
    drain: Drain, agent: Agent, client: ClientAgent
) -> None:
    done = await client.enqueue(Echo(text="done"))
    await drain()
    before = await client.get_state(done)
    after = await client.cancel(done)
    assert before is not None and after is not None
    assert after.status is JobStatus.SUCCESS and after.to_dict() == before.to_dict()
    canceled = await client.enqueue(Echo())
    first = await client.cancel(canceled)
    second = await client.cancel(canceled)
    assert first is not None and second is not None
    assert first.to_dict() == second.to_dict()
    assert await client.cancel("no-such-id") is None


async def test_cancel_of_a_claimed_job_is_honoured_at_start(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """A cancel that lands after arq claimed the job but before it started: the job is skipped.

    Only the plain arq worker has that window (START is its own call there); the agent worker
    records STARTED in arq's pickup transaction itself, so a later cancel is a running-job cancel.
    """
    job_id = await client.enqueue(Echo(text="late"))
    original_start = agent.job_store.start

    async def cancel_then_start(jid: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        await client.cancel(jid)
        return await original_start(jid, **kwargs)

    agent.job_store.start = cancel_then_start  # type: ignore[method-assign]
    await run_burst(agent, "arq_cli_worker")
    assert await redis.hget(runs_key(agent.keys.namespace), job_id) is None
    assert (await client.get_state(job_id)).status is JobStatus.CANCELED  # type: ignore[union-attr]
