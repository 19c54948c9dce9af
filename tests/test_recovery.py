"""JobRecovery: orphans re-queued or failed per `resume`, under a lock; redeliveries follow the same rule."""

from __future__ import annotations

import asyncio
import dataclasses

from redis.asyncio import Redis

from agent_async import Agent, ClientAgent, JobStatus
from agent_async.worker import JobRecovery
from tests.conftest import Drain, run_burst, running_worker, wait_for_status
from tests.jobs import Echo, NotResumable, Resumable, Sleeper, runs_key


async def lose_worker(agent: Agent, redis: Redis, job_id: str) -> None:
    """Make `job_id` look like a run whose worker was SIGKILLed: STARTED, arq's in-progress key
    held (as arq leaves it), and a lease that has run out."""
    decision = await agent.job_store.start(job_id)
    assert decision.run
    await redis.set(agent.engine.ref(job_id).claim_key, b"1", px=600_000)
    await redis.zadd(agent.keys.leases, {job_id: 1})


async def runs(redis: Redis, agent: Agent, job_id: str) -> int:
    return int(await redis.hget(runs_key(agent.keys.namespace), job_id) or 0)


async def test_lost_resumable_job_is_requeued_and_runs_again(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """resume=True, attempts left: PENDING again under the same id, arq's stale in-progress key
    cleared so it runs at once (not after arq's in-progress TTL), then SUCCESS."""
    job_id = await client.enqueue(Resumable(), "u")
    await lose_worker(agent, redis, job_id)
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0) == 1
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.PENDING
    assert state.error is not None and "worker was lost during attempt 1" in state.error
    assert not await redis.exists(agent.engine.ref(job_id).claim_key)
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS and state.attempts == 2
    assert await runs(redis, agent, job_id) == 1
    assert await agent.job_store.slots_held(agent.keys.gate(Resumable.name, "u")) == 0


async def test_lost_job_without_resume_fails_and_is_not_redelivered(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    job_id = await client.enqueue(NotResumable(), "u")
    await lose_worker(agent, redis, job_id)
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0) == 1
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.error == "WorkerLost: the worker was lost during attempt 1 (resume is off)"
    assert await redis.zcard(agent.engine.names.queue) == 0, "arq's copy is gone: it cannot run again"
    await drain()
    assert await runs(redis, agent, job_id) == 0
    assert await agent.job_store.slots_held(agent.keys.gate(NotResumable.name, "u")) == 0


async def test_lost_resumable_job_out_of_attempts_fails(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    job_id = await client.enqueue(Resumable())
    await lose_worker(agent, redis, job_id)
    await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0)  # attempt 1 lost: re-queued
    await redis.delete(agent.engine.ref(job_id).claim_key)
    await lose_worker(agent, redis, job_id)  # attempt 2 lost too
    await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0)
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.error == "WorkerLost: the worker was lost during attempt 2 (no attempts left)"


async def test_live_lease_is_left_alone(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """A STARTED job whose lease is being renewed is not an orphan, however long it runs."""
    job_id = await client.enqueue(NotResumable())
    await agent.job_store.start(job_id)
    await redis.set(agent.engine.ref(job_id).claim_key, b"1", px=600_000)
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0) == 0
    assert (await client.get_state(job_id)).status is JobStatus.STARTED  # type: ignore[union-attr]


async def test_pending_job_missing_from_the_queue_is_requeued(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """PENDING but not in arq (its queue entry was lost, e.g. Redis restored from an old dump)."""
    job_id = await client.enqueue(Resumable())
    ref = agent.engine.ref(job_id)
    queue, job_key, engine_id = ref.queue_key, ref.job_key, ref.engine_job_id
    await redis.zrem(queue, engine_id)
    await redis.delete(job_key)
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0) == 1
    await drain()
    assert (await client.get_state(job_id)).status is JobStatus.SUCCESS  # type: ignore[union-attr]


async def test_redelivery_after_a_crash_follows_resume(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """arq redelivering a run that never finished (its in-progress key expired) does not run a
    resume=False job again: it ends FAILURE at start; a resume=True job runs."""
    no_resume = await client.enqueue(NotResumable())
    resume = await client.enqueue(Resumable())
    for job_id in (no_resume, resume):
        assert (await agent.job_store.start(job_id)).run  # STARTED by a worker that then died
    await run_burst(agent)
    failed = await client.get_state(no_resume)
    assert failed is not None and failed.status is JobStatus.FAILURE
    assert failed.error is not None and failed.error.startswith("WorkerLost")
    assert await runs(redis, agent, no_resume) == 0
    resumed = await client.get_state(resume)
    assert resumed is not None and resumed.status is JobStatus.SUCCESS and resumed.attempts == 2


async def test_cancel_of_a_job_whose_worker_died_ends_canceled(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    job_id = await client.enqueue(Resumable())
    await lose_worker(agent, redis, job_id)
    state = await client.cancel(job_id, wait_s=0)
    assert state is not None and state.status is JobStatus.STARTED
    await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0)
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.CANCELED
    assert await redis.zcard(agent.engine.names.queue) == 0


async def test_one_sweeper_at_a_time(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """reconcile_orphans takes the namespace's recovery lock; a second caller gets None."""
    await redis.set(agent.keys.recovery_lock, "someone-else", px=5_000)
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile_orphans() is None
    await redis.delete(agent.keys.recovery_lock)
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile_orphans() == 0
    assert not await redis.exists(agent.keys.recovery_lock), "released after the pass"


async def test_a_held_pass_keeps_the_lock_until_it_expires(agent: Agent, redis: Redis) -> None:
    """hold=True (the periodic passes): the lock stays for its TTL, so no other pass runs meanwhile."""
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile_orphans(lock_ttl_s=0.5, hold=True) == 0
    ttl_ms = await redis.pttl(agent.keys.recovery_lock)
    assert 0 < ttl_ms <= 500
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile_orphans() is None
    await asyncio.sleep(ttl_ms / 1000 + 0.05)
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile_orphans() == 0


async def test_worker_start_up_recovers_orphans(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """The sweep runs when a worker starts: a lost resumable job is run by the new worker."""
    job_id = await client.enqueue(Resumable())
    await lose_worker(agent, redis, job_id)
    await run_burst(agent)
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS and state.attempts == 2


async def test_heartbeat_keeps_a_long_job_alive(agent: Agent) -> None:
    """A job running longer than its lease keeps it renewed by the worker's heartbeat."""
    async with Agent(dataclasses.replace(agent.settings, lease_s=0.6)) as short, running_worker(short):
        job_id = await ClientAgent(short).enqueue(Sleeper(sleep_s=1.5))
        await wait_for_status(short, job_id, JobStatus.STARTED)
        await asyncio.sleep(1.0)  # past the 0.6 s lease: only renewal keeps it
        assert await JobRecovery(short.job_store, engine=short.engine).reconcile(idle_for_ms=0) == 0
        state = await wait_for_status(short, job_id, JobStatus.SUCCESS)
    assert state.attempts == 1


async def test_paged_passes_cover_the_whole_backlog(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """A worker's pass looks at one page of the active index (plus every expired lease), resuming
    where it stopped: a backlog costs the same per pass, and every job is still looked at."""
    ids = [await client.enqueue(Resumable()) for _ in range(3)] + [await client.enqueue(Echo()) for _ in range(4)]
    for job_id in ids:  # all lost from arq's queue
        ref = agent.engine.ref(job_id)
        queue, job_key, engine_id = ref.queue_key, ref.job_key, ref.engine_job_id
        await redis.zrem(queue, engine_id)
        await redis.delete(job_key)
    lost_runner = await client.enqueue(NotResumable())
    await lose_worker(agent, redis, lost_runner)
    recovery = JobRecovery(agent.job_store, engine=agent.engine, page_size=3)
    first = await recovery.reconcile(idle_for_ms=0)
    assert first == 4, "one page of 3 plus the expired lease"
    assert (await client.get_state(lost_runner)).status is JobStatus.FAILURE  # type: ignore[union-attr]
    total = first
    for _ in range(4):
        total += await recovery.reconcile(idle_for_ms=0)
    assert total == len(ids) + 1


async def test_claim_of_a_worker_lost_before_start_is_released(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """A worker that claimed a job (arq's in-progress key) but died before starting it would block
    the job until the key expires (the longest timeout + 10 s); recovery releases the claim once it
    is older than a lease, and the job runs."""
    job_id = await client.enqueue(Resumable())
    in_progress = agent.engine.ref(job_id).claim_key
    claim_ttl_ms = agent.engine.claim_ttl_ms()
    assert claim_ttl_ms is not None
    # Claimed "a lease and a second ago": its remaining TTL is that much shorter.
    await redis.set(in_progress, b"1", px=claim_ttl_ms - agent.job_store.lease_ms - 1000)
    fresh = await client.enqueue(Resumable())
    await redis.set(agent.engine.ref(fresh).claim_key, b"1", px=claim_ttl_ms - 100)  # claimed just now
    await redis.delete(agent.engine.names.wake_key)  # the enqueues' tokens, taken by idle workers
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0) == 1
    assert not await redis.exists(in_progress)
    assert await redis.llen(agent.engine.names.wake_key) == 1, "an idle worker is woken for the released job"
    assert await redis.exists(agent.engine.ref(fresh).claim_key), "a fresh claim is left alone"
    await redis.delete(agent.engine.ref(fresh).claim_key)
    await drain()
    assert (await client.get_state(job_id)).status is JobStatus.SUCCESS  # type: ignore[union-attr]
