"""Job.authorize: access is checked again in the worker, just before process()."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from redis.asyncio import Redis

from agent_async import AccessRevoked, Agent, ClientAgent, Job, JobRequest, JobStatus, agent_job
from tests.conftest import Drain


def revoked_key(namespace: str) -> str:
    return f"{namespace}:tests:revoked"


def processed_key(namespace: str) -> str:
    return f"{namespace}:tests:processed"


@dataclass
class Guarded(JobRequest):
    name: ClassVar[str] = "tests.authorize.guarded"
    max_concurrent: ClassVar[int] = 1
    max_try: ClassVar[int] = 3
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (AccessRevoked,)  # must not be retried anyway


@agent_job
class GuardedJob(Job[Guarded]):
    request_class = Guarded

    async def authorize(self, request: Guarded, *, user_uid: str, job_id: str) -> None:
        redis = self.resources.redis
        await redis.hincrby(processed_key(self.resources.namespace), f"authorize:{user_uid}", 1)
        if await redis.sismember(revoked_key(self.resources.namespace), user_uid):
            raise AccessRevoked(f"user {user_uid} no longer owns this calendar")

    async def process(self, request: Guarded, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await self.resources.redis.hincrby(processed_key(self.resources.namespace), job_id, 1)
        return {"ran": True}


async def test_revoked_between_enqueue_and_run_is_canceled_without_running(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    job_id = await client.enqueue(Guarded(), "mallory")
    await redis.sadd(revoked_key(namespace), "mallory")
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.CANCELED
    assert state.error == "AccessRevoked: user mallory no longer owns this calendar"
    assert state.attempts == 1, "not retried, although AccessRevoked is listed in retry_for"
    assert await redis.hget(processed_key(namespace), job_id) is None, "process() never ran"
    assert await agent.job_store.slots_held(agent.keys.gate(Guarded.name, "mallory")) == 0


async def test_an_authorized_user_runs_and_a_system_job_is_not_checked(
    drain: Drain, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    mine = await client.enqueue(Guarded(), "alice")
    system = await client.enqueue(Guarded())
    await drain()
    for job_id in (mine, system):
        state = await client.get_state(job_id)
        assert state is not None and state.status is JobStatus.SUCCESS
    calls = await redis.hgetall(processed_key(namespace))
    assert calls[b"authorize:alice"] == b"1"
    assert not any(k.startswith(b"authorize:") and k != b"authorize:alice" for k in calls), "no user, no check"
