"""agent_async.testing: drain, wait_for_status, running_worker, scoped_registry and WaitTimeoutError."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis

from agent_async import Agent, ClientAgent, Job, JobRequest, JobStatus, agent_job, testing
from agent_async.errors import AgentError
from agent_async.registry import registry
from agent_async.testing import WaitTimeoutError, drain, running_worker, scoped_registry, wait_for_status


def runs_key(namespace: str) -> str:
    return f"{namespace}:test_testing:runs"


@dataclass
class Count(JobRequest):
    name: ClassVar[str] = "test_testing.count"
    text: str = ""


@agent_job
class CountJob(Job[Count]):
    request_class = Count

    async def process(self, request: Count, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        runs = await self.resources.redis.hincrby(runs_key(self.resources.namespace), job_id, 1)
        return {"text": request.text, "runs": int(runs)}


@dataclass
class Fail(JobRequest):
    name: ClassVar[str] = "test_testing.fail"


@agent_job
class FailJob(Job[Fail]):
    request_class = Fail

    async def process(self, request: Fail, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        raise RuntimeError("test_testing: fails on purpose")


@dataclass
class RetryOnce(JobRequest):
    """Fails its first run with a retryable error: drain must also run the retry."""

    name: ClassVar[str] = "test_testing.retry_once"
    max_try: ClassVar[int] = 2
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (ValueError,)


@agent_job
class RetryOnceJob(Job[RetryOnce]):
    request_class = RetryOnce

    async def process(self, request: RetryOnce, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        runs = int(await self.resources.redis.hincrby(runs_key(self.resources.namespace), job_id, 1))
        if runs == 1:
            raise ValueError("first run fails")
        return {"runs": runs}


async def runs_of(redis: Redis, agent: Agent, job_id: str) -> int:
    return int(await redis.hget(runs_key(agent.settings.namespace), job_id) or 0)


# -- drain -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stock_worker", [False, True], ids=["agent_worker", "stock_worker"])
async def test_drain_runs_every_queued_job(
    stock_worker: bool, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    counted = [await client.enqueue(Count(text=str(i)), "ann") for i in range(5)]
    failed = await client.enqueue(Fail())
    retried = await client.enqueue(RetryOnce(), "ben")

    started = time.monotonic()
    await drain(agent, stock_worker=stock_worker)
    assert time.monotonic() - started < 30

    for i, job_id in enumerate(counted):
        state = await client.get_state(job_id)
        assert state is not None and state.status is JobStatus.SUCCESS, state
        assert state.result == {"text": str(i), "runs": 1}
        assert await runs_of(redis, agent, job_id) == 1
    failure = await client.get_state(failed)
    assert failure is not None and failure.status is JobStatus.FAILURE
    assert failure.error is not None and "fails on purpose" in failure.error
    retry = await client.get_state(retried)
    assert retry is not None and retry.status is JobStatus.SUCCESS and retry.result == {"runs": 2}
    assert await agent.job_store.active_job_ids() == []


@pytest.mark.parametrize("stock_worker", [False, True], ids=["agent_worker", "stock_worker"])
async def test_drain_of_an_empty_queue_returns(stock_worker: bool, agent: Agent) -> None:
    await asyncio.wait_for(drain(agent, stock_worker=stock_worker), timeout=10)


async def test_drain_returns_once_the_queue_is_empty_and_runs_nothing_twice(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    job_id = await client.enqueue(Count())
    await drain(agent)
    await drain(agent)
    assert await runs_of(redis, agent, job_id) == 1


@pytest.mark.parametrize("stock_worker", [False, True], ids=["agent_worker", "stock_worker"])
async def test_drain_runs_the_chosen_worker_in_burst_mode(
    stock_worker: bool, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both workers give the same outcomes, so which one ran is only seen at the call: burst, no poll delay,
    the chosen kind, and the caller's overrides on top."""
    calls: list[dict[str, Any]] = []
    original = agent.run_worker

    async def spy(**kwargs: Any) -> None:
        calls.append(kwargs)
        await original(**kwargs)

    monkeypatch.setattr(agent, "run_worker", spy)
    await drain(agent, stock_worker=stock_worker)
    await drain(agent, stock_worker=stock_worker, poll_delay=0.001)
    assert calls == [
        {"burst": True, "stock_worker": stock_worker, "poll_delay": 0, "handle_signals": False},
        {"burst": True, "stock_worker": stock_worker, "poll_delay": 0.001, "handle_signals": False},
    ]


def test_the_conftest_drain_is_the_public_one() -> None:
    from tests import conftest

    assert conftest.running_worker is running_worker
    assert conftest.wait_for_status is wait_for_status
    assert testing.drain is drain


# -- wait_for_status -------------------------------------------------------------------------------


async def test_wait_for_status_returns_the_state_once_reached(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Count(text="w"))
    pending = await wait_for_status(agent, job_id, JobStatus.PENDING, timeout_s=1)
    assert pending.job_id == job_id and pending.status is JobStatus.PENDING

    async with running_worker(agent):
        state = await wait_for_status(agent, job_id, JobStatus.SUCCESS, timeout_s=10)
    assert state.status is JobStatus.SUCCESS and state.result == {"text": "w", "runs": 1}


async def test_wait_for_status_accepts_any_of_several_statuses(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Fail())
    await drain(agent)
    state = await wait_for_status(agent, job_id, JobStatus.SUCCESS, JobStatus.FAILURE, timeout_s=1)
    assert state.status is JobStatus.FAILURE


async def test_wait_for_status_times_out_for_a_job_that_never_runs(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Count())
    loop = asyncio.get_running_loop()
    started = loop.time()

    with pytest.raises(WaitTimeoutError) as caught:
        await wait_for_status(agent, job_id, JobStatus.SUCCESS, timeout_s=0.3, poll_s=0.01)

    waited = loop.time() - started
    assert 0.3 <= waited < 3, waited
    assert isinstance(caught.value, AssertionError) and isinstance(caught.value, AgentError)
    message = str(caught.value)
    assert job_id in message and "SUCCESS" in message and "0.3" in message and "PENDING" in message


async def test_wait_for_status_times_out_for_an_unknown_job(agent: Agent) -> None:
    unknown = uuid.uuid4().hex
    with pytest.raises(WaitTimeoutError, match=unknown):
        await wait_for_status(agent, unknown, timeout_s=0.1, poll_s=0.01)


async def test_without_statuses_it_waits_for_any_terminal_status(agent: Agent, client: ClientAgent) -> None:
    succeeded = await client.enqueue(Count())
    failed = await client.enqueue(Fail())
    await drain(agent)
    canceled = await client.enqueue(Count())
    await client.cancel(canceled)

    expected_of = {succeeded: JobStatus.SUCCESS, failed: JobStatus.FAILURE, canceled: JobStatus.CANCELED}
    for job_id, expected in expected_of.items():
        state = await wait_for_status(agent, job_id, timeout_s=1)
        assert state.status is expected


async def test_without_statuses_a_pending_job_times_out(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Count())
    with pytest.raises(WaitTimeoutError, match=r"CANCELED.*FAILURE.*SUCCESS"):
        await wait_for_status(agent, job_id, timeout_s=0.1, poll_s=0.01)


# -- running_worker --------------------------------------------------------------------------------


async def test_running_worker_serves_jobs_in_the_background(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    async with running_worker(agent) as task:
        assert isinstance(task, asyncio.Task) and not task.done()
        # Enqueued while the worker runs: it picks them up without being told.
        ids = [await client.enqueue(Count(text=str(i))) for i in range(3)]
        for job_id in ids:
            assert (await wait_for_status(agent, job_id, timeout_s=10)).status is JobStatus.SUCCESS
        assert not task.done(), "the worker keeps serving inside the block"
    assert task.done()
    for job_id in ids:
        assert await runs_of(redis, agent, job_id) == 1


async def test_running_worker_stops_on_exit(agent: Agent, client: ClientAgent) -> None:
    async with running_worker(agent) as task:
        await wait_for_status(agent, await client.enqueue(Count()), timeout_s=10)
    assert task.done()

    # No worker any more: a job enqueued now stays queued.
    after = await client.enqueue(Count())
    with pytest.raises(WaitTimeoutError):
        await wait_for_status(agent, after, JobStatus.SUCCESS, timeout_s=0.3)


async def test_running_worker_stops_when_the_block_raises(agent: Agent) -> None:
    seen: list[asyncio.Task[None]] = []
    with pytest.raises(KeyError, match="from the block"):
        async with running_worker(agent) as task:
            seen.append(task)
            await asyncio.sleep(0.05)
            raise KeyError("from the block")
    assert seen[0].done()


# -- scoped_registry -------------------------------------------------------------------------------


def test_scoped_registry_forgets_jobs_declared_inside_it() -> None:
    job_name = f"test_testing.scoped_{uuid.uuid4().hex[:8]}"
    with scoped_registry() as scoped:
        assert scoped is registry

        @dataclass
        class Inside(JobRequest):
            name: ClassVar[str] = job_name

        @agent_job
        class InsideJob(Job[Inside]):
            request_class = Inside

            async def process(self, request: Inside, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
                return {}

        assert registry.job(job_name) is InsideJob and registry.request(job_name) is Inside
    assert registry.job(job_name) is None and registry.request(job_name) is None
    # What was declared before the block is kept.
    assert registry.job(Count.name) is CountJob and registry.request(Count.name) is Count


def test_scoped_registry_forgets_even_when_the_block_raises() -> None:
    job_name = f"test_testing.raised_{uuid.uuid4().hex[:8]}"
    with pytest.raises(RuntimeError, match="inside"), scoped_registry():

        @dataclass
        class Inside(JobRequest):
            name: ClassVar[str] = job_name

        raise RuntimeError("inside")
    assert registry.request(job_name) is None


def test_a_name_freed_by_the_scope_can_be_declared_again() -> None:
    job_name = f"test_testing.again_{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        with scoped_registry():

            @dataclass
            class Again(JobRequest):
                name: ClassVar[str] = job_name

            @agent_job
            class AgainJob(Job[Again]):
                request_class = Again

                async def process(self, request: Again, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
                    return {}

            assert registry.job(job_name) is AgainJob
