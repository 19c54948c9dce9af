"""A job's life through a real worker: success, failure, retries, time limits."""

from __future__ import annotations

from redis.asyncio import Redis

from agent_async import Agent, ClientAgent, JobStatus
from tests.conftest import Drain
from tests.jobs import BadResult, Boom, Echo, Flaky, Slow, SlowRetried, runs_key


async def runs(redis: Redis, agent: Agent, job_id: str) -> int:
    return int(await redis.hget(runs_key(agent.keys.namespace), job_id) or 0)


async def test_success_stores_inline_result(drain: Drain, agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """enqueue -> worker -> SUCCESS, with process()'s dict as the result and one attempt."""
    job_id = await client.enqueue(Echo(text="hi", numbers=[1, 2, 3]), "alice")
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.PENDING and state.attempts == 0

    await drain()

    state = await client.get_state(job_id)
    assert state is not None
    assert state.status is JobStatus.SUCCESS
    assert state.result == {"echo": "hi", "sum": 6, "user": "alice"}
    assert state.attempts == 1 and state.error is None
    assert state.started_ms is not None and state.finished_ms is not None
    assert state.created_ms <= state.started_ms <= state.finished_ms
    assert await runs(redis, agent, job_id) == 1


async def test_non_retryable_failure_fails_after_one_attempt(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """An exception outside retry_for ends FAILURE at once, even with max_try 3."""
    job_id = await client.enqueue(Boom())
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.attempts == 1
    assert state.error == "RuntimeError: boom: not retryable"
    assert await runs(redis, agent, job_id) == 1


async def test_retry_then_success(drain: Drain, agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """A retryable exception is retried under the same job id; the second attempt succeeds."""
    job_id = await client.enqueue(Flaky(fail_times=1), "bob")
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS
    assert state.attempts == 2
    assert state.result == {"runs": 2}
    assert state.error is None, "a success clears the error of the failed attempt"


async def test_retries_exhausted(drain: Drain, agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """max_try attempts, then FAILURE naming the last error."""
    job_id = await client.enqueue(Flaky(fail_times=10))
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.attempts == 3 == Flaky.max_try
    assert state.error == "ValueError: flaky failure #3 (gave up after 3 attempts)"
    assert await runs(redis, agent, job_id) == 3


async def test_soft_timeout_fails_with_a_clear_error(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """Past soft_timeout_seconds the run is cancelled (the job may clean up) and the error says why."""
    job_id = await client.enqueue(Slow(sleep_s=5))
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.error == "SoftTimeLimitExceeded: soft time limit of 0.2s exceeded"
    assert state.attempts == 1
    assert await redis.hget(runs_key(agent.keys.namespace) + ":cleanup", job_id) == b"1"


async def test_soft_timeout_is_retried_when_listed(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """SoftTimeLimitExceeded in retry_for: every attempt times out, max_try attempts are made."""
    job_id = await client.enqueue(SlowRetried())
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.attempts == 2
    assert state.error is not None and state.error.startswith("SoftTimeLimitExceeded")
    assert await runs(redis, agent, job_id) == 2


async def test_result_that_is_not_json_fails_the_job(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    """A result JSON cannot carry is a FAILURE with a clear error, not a crash of the worker."""
    job_id = await client.enqueue(BadResult())
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.error is not None and "invalid result" in state.error and "object" in state.error


async def test_states_are_json_on_the_wire(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """The engine's job payload in Redis is JSON, never a pickle."""
    job_id = await client.enqueue(Echo(text="wire"))
    raw = await redis.get(f"arq:job:{agent.engine.names.engine_job_id(job_id)}")
    assert raw is not None and raw.startswith(b"{")
    import json

    decoded = json.loads(raw)
    assert decoded["f"] == "tests.echo" and decoded["a"] == [{"text": "wire", "numbers": []}]
