"""JobRequest.owned_blobs: a job's input blobs are deleted once it ends, however it ends."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, Job, JobDeclarationError, JobRequest, JobStatus, agent_job
from agent_async.storage import ClientStorage, upgrade_async
from agent_async.worker import JobRecovery
from tests.conftest import Drain, running_worker, wait_for_status


class Flaky(Exception):
    pass


@dataclass
class Consume(JobRequest):
    name: ClassVar[str] = "tests.owned.consume"
    owned_blobs: ClassVar[tuple[str, ...]] = ("source_ref",)
    max_try: ClassVar[int] = 2
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (Flaky,)
    soft_timeout_seconds: ClassVar[float] = 20

    source_ref: str = ""
    outcome: str = "ok"  # ok | fail | flaky | sleep


@agent_job
class ConsumeJob(Job[Consume]):
    request_class = Consume

    async def process(self, request: Consume, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        # The job reads its input but does not delete it: the layer does, once the job has ended.
        assert await self.resources.large_store().load_text(request.source_ref) == "input"
        if request.outcome == "fail":
            raise ValueError("refused")
        if request.outcome == "flaky":
            raise Flaky("again")
        if request.outcome == "sleep":
            await asyncio.sleep(15)
        return {"ok": True}


@pytest.fixture
async def store(agent: Agent, settings: AgentSettings) -> ClientStorage:
    await upgrade_async(settings.database_url)
    return agent.get_large_store()


async def upload(store: ClientStorage) -> str:
    return await store.save_text("input", "text/plain")


async def gone(store: ClientStorage, ref: str) -> bool:
    return await store.load(ref) is None


@pytest.mark.parametrize("outcome", ["ok", "fail", "flaky"])
async def test_blobs_go_when_the_worker_ends_the_job(
    outcome: str, drain: Drain, agent: Agent, client: ClientAgent, store: ClientStorage
) -> None:
    """Success, failure and retries exhausted: each ends the job, and the next sweep deletes its input."""
    ref = await upload(store)
    job_id = await client.enqueue(Consume(source_ref=ref, outcome=outcome), "u")
    await drain()
    await drain()  # the flaky one's second (last) attempt
    state = await client.get_state(job_id)
    assert state is not None and state.is_terminal and state.attempts == (2 if outcome == "flaky" else 1)
    # Deleted by a sweep, not by the job's end: ours below, unless the worker's own recovery pass
    # (every reconcile_interval_s, 0.2 s here) already ran one while the drain was going.
    if not await gone(store, ref):
        assert await agent.owned_blobs.sweep() == 1
    assert await gone(store, ref)
    assert await agent.owned_blobs.sweep() == 0, "forgotten once deleted"


async def test_a_job_that_has_not_ended_keeps_its_blob(agent: Agent, client: ClientAgent, store: ClientStorage) -> None:
    ref = await upload(store)
    await client.enqueue(Consume(source_ref=ref), "u")
    assert await agent.owned_blobs.sweep() == 0
    assert not await gone(store, ref)


async def test_cancel_before_it_starts_deletes_at_once(client: ClientAgent, store: ClientStorage) -> None:
    ref = await upload(store)
    job_id = await client.enqueue(Consume(source_ref=ref), "u")
    state = await client.cancel(job_id)
    assert state is not None and state.status is JobStatus.CANCELED
    assert await gone(store, ref)


async def test_cancel_while_it_runs_deletes_once_it_stopped(
    agent: Agent, client: ClientAgent, store: ClientStorage
) -> None:
    ref = await upload(store)
    job_id = await client.enqueue(Consume(source_ref=ref, outcome="sleep"), "u")
    async with running_worker(agent):
        await wait_for_status(agent, job_id, JobStatus.STARTED)
        state = await client.cancel(job_id)
    assert state is not None and state.status is JobStatus.CANCELED
    assert await gone(store, ref)


async def test_worker_lost_deletes_after_recovery(
    agent: Agent, client: ClientAgent, redis: Redis, store: ClientStorage
) -> None:
    ref = await upload(store)
    job_id = await client.enqueue(Consume(source_ref=ref), "u")
    assert (await agent.job_store.start(job_id)).run  # STARTED by a worker that then died
    await redis.zadd(agent.keys.leases, {job_id: 1})
    await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0)
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE and "WorkerLost" in (state.error or "")
    assert await agent.owned_blobs.sweep() == 1
    assert await gone(store, ref)


async def test_a_running_worker_sweeps_on_its_own(agent: Agent, client: ClientAgent, store: ClientStorage) -> None:
    """No explicit sweep: the worker's recovery loop (every reconcile interval) deletes the blob."""
    ref = await upload(store)
    job_id = await client.enqueue(Consume(source_ref=ref, outcome="fail"), "u")
    async with running_worker(agent):
        await wait_for_status(agent, job_id, JobStatus.FAILURE)
        deadline = asyncio.get_running_loop().time() + 10
        while not await gone(store, ref):
            assert asyncio.get_running_loop().time() < deadline, "the worker never swept"
            await asyncio.sleep(0.05)


def test_owned_blobs_must_name_payload_fields(job_registry: object) -> None:
    with pytest.raises(JobDeclarationError, match=r"owned_blobs names \['nope'\]"):

        @dataclass
        class Wrong(JobRequest):
            name: ClassVar[str] = "tests.owned.wrong"
            owned_blobs: ClassVar[tuple[str, ...]] = ("nope",)
            source_ref: str = ""
