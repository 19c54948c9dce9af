"""WorkerRuntime: the attempts a worker tracks, their leases, cancel requests and recovery passes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from agent_async import Agent, ClientAgent, JobRequest, JobStatus
from agent_async.lifecycle import StartDecision
from agent_async.worker import JobRecovery, RunHandle, WorkerRuntime
from tests.conftest import wait_for_status
from tests.jobs import Echo

# Heartbeat every LEASE_S / 3 = 0.1 s.
LEASE_S = 0.3
RECONCILE_S = 0.2


@dataclass
class Tracked(JobRequest):
    """Never run by a worker here: the tests start it in the store and track it by hand."""

    name: ClassVar[str] = "test_runtime.tracked"


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        await asyncio.sleep(0.01)


def make_runtime(agent: Agent, recovery: JobRecovery | None = None) -> WorkerRuntime:
    return WorkerRuntime(
        agent.job_store,
        recovery=recovery or JobRecovery(agent.job_store, engine=agent.engine),
        lease_s=LEASE_S,
        reconcile_interval_s=RECONCILE_S,
    )


@pytest.fixture
async def runtime(agent: Agent) -> AsyncIterator[WorkerRuntime]:
    rt = make_runtime(agent)
    try:
        yield rt
    finally:
        await rt.stop()


async def started_job(client: ClientAgent, agent: Agent) -> str:
    job_id = await client.enqueue(Tracked())
    assert (await agent.job_store.start(job_id)).run
    return job_id


async def lease_of(redis: Redis, agent: Agent, job_id: str) -> float | None:
    score = await redis.zscore(agent.keys.leases, job_id)
    return None if score is None else float(score)


async def subscribed(redis: Redis, agent: Agent) -> bool:
    [(_, count)] = await redis.pubsub_numsub(agent.keys.cancel_channel)
    return int(count) > 0


# -- tracking --------------------------------------------------------------------------------------


def test_track_untrack_and_request_cancel(agent: Agent) -> None:
    rt = make_runtime(agent)
    handle = rt.track("a")
    assert isinstance(handle, RunHandle) and handle.job_id == "a"
    assert rt.running == {"a": handle}
    assert not handle.cancel_requested
    woken: list[bool] = []
    handle.waker = lambda: woken.append(True)
    assert rt.request_cancel("a") is True
    assert handle.cancel_requested and woken == [True]
    assert rt.request_cancel("unknown") is False
    rt.untrack("a")
    assert rt.running == {}
    assert rt.request_cancel("a") is False, "an untracked attempt is not ours to cancel"
    rt.untrack("a")  # untracking twice is harmless


def test_tracking_again_gives_a_fresh_handle(agent: Agent) -> None:
    """A new attempt of the same job id does not inherit the last one's cancel request."""
    rt = make_runtime(agent)
    first = rt.track("a")
    first.request_cancel()
    second = rt.track("a")
    assert second is not first and not second.cancel_requested
    assert rt.running == {"a": second}


def test_releasing_a_job_leaves_a_newer_attempt_of_it_tracked(agent: Agent) -> None:
    """A retry can be claimed as soon as the last attempt's finish lets the job go, and start
    before that attempt's task releases it: the release is the ended attempt's, not the new one's
    (whose lease would no longer be renewed, and whose cancels would go nowhere)."""
    rt = make_runtime(agent)
    first = rt.track("a")
    rt.release_ended("a")
    assert rt.running == {"a": first}, "an attempt still running is not released"
    first.ended = True
    second = rt.track("a")
    rt.release_ended("a")
    assert rt.running == {"a": second}
    assert rt.request_cancel("a") is True and second.cancel_requested
    second.ended = True
    rt.release_ended("a")
    assert rt.running == {}


async def test_an_attempt_is_ended_once_it_returns_and_released_after(agent: Agent) -> None:
    """The service marks an attempt ended when it returns (its outcome is not written yet: it stays
    tracked, its lease renewed) and releases it when told."""
    service = agent.worker
    service.runtime = make_runtime(agent)
    decision = StartDecision(run=True, attempts=1, name=Echo.name)
    handles: list[RunHandle] = []
    real_track = service.runtime.track

    def track(job_id: str) -> RunHandle:
        handles.append(real_track(job_id))
        return handles[-1]

    service.runtime.track = track  # type: ignore[method-assign]
    try:
        await service.run(Echo.name, {"text": "x"}, job_id="a", decision=decision)
        assert [h.ended for h in handles] == [True]
        assert service.runtime.running == {"a": handles[0]}
        service.release("a")
        assert service.runtime.running == {}
    finally:
        service.runtime = None


# -- heartbeat -------------------------------------------------------------------------------------


async def test_heartbeat_renews_the_leases_of_tracked_jobs_only(
    agent: Agent, client: ClientAgent, redis: Redis, runtime: WorkerRuntime
) -> None:
    tracked, untracked, dropped = [await started_job(client, agent) for _ in range(3)]
    before = {job_id: await lease_of(redis, agent, job_id) for job_id in (tracked, untracked, dropped)}
    assert all(score is not None for score in before.values())
    runtime.track(tracked)
    runtime.track(dropped)
    runtime.untrack(dropped)
    await runtime.start()
    await eventually(
        lambda: _moved(redis, agent, tracked, before[tracked]), what="the tracked job's lease moves forward"
    )
    assert await lease_of(redis, agent, untracked) == before[untracked]
    assert await lease_of(redis, agent, dropped) == before[dropped]
    # It keeps renewing, past the point where the first lease would have run out.
    first_renewal = await lease_of(redis, agent, tracked)
    assert first_renewal is not None
    await eventually(lambda: _moved(redis, agent, tracked, first_renewal), what="a second renewal")


async def _moved(redis: Redis, agent: Agent, job_id: str, before: float | None) -> bool:
    now = await lease_of(redis, agent, job_id)
    return now is not None and before is not None and now > before


async def test_heartbeat_never_creates_a_lease(
    agent: Agent, client: ClientAgent, redis: Redis, runtime: WorkerRuntime
) -> None:
    """A tracked job without a lease (ended meanwhile) does not get one back from the heartbeat."""
    ended = await started_job(client, agent)
    assert await agent.job_store.transition(ended, JobStatus.SUCCESS, result={})
    assert await lease_of(redis, agent, ended) is None
    live = await started_job(client, agent)
    before = await lease_of(redis, agent, live)
    runtime.track(ended)
    runtime.track(live)
    await runtime.start()
    await eventually(lambda: _moved(redis, agent, live, before), what="the live job's lease moves forward")
    assert await lease_of(redis, agent, ended) is None


async def test_heartbeat_picks_up_a_cancel_flag(
    agent: Agent, client: ClientAgent, redis: Redis, runtime: WorkerRuntime
) -> None:
    """The fallback for a missed pub/sub message: the flag on the state hash alone stops the job."""
    job_id = await started_job(client, agent)
    other = await started_job(client, agent)
    handle = runtime.track(job_id)
    other_handle = runtime.track(other)
    await runtime.start()
    await redis.hset(agent.keys.state(job_id), "cancel_requested_ms", str(int(time.time() * 1000)))

    async def flagged() -> bool:
        return handle.cancel_requested

    await eventually(flagged, what="the heartbeat sees the cancel flag")
    assert not other_handle.cancel_requested


# -- cancel listener -------------------------------------------------------------------------------


async def test_cancel_message_stops_the_tracked_job(
    agent: Agent, client: ClientAgent, redis: Redis, runtime: WorkerRuntime
) -> None:
    job_id = await started_job(client, agent)
    handle = runtime.track(job_id)
    bystander = runtime.track("bystander")
    await runtime.start()
    await eventually(lambda: subscribed(redis, agent), what="the runtime subscribes to the cancel channel")
    # An id this worker does not run is ignored, and the listener goes on.
    await redis.publish(agent.keys.cancel_channel, "not-running-here")
    t0 = time.monotonic()
    await redis.publish(agent.keys.cancel_channel, job_id)

    async def flagged() -> bool:
        return handle.cancel_requested

    await eventually(flagged, timeout_s=2.0, what="the cancel message reaches the handle")
    # No flag on the state hash: only the message can have done it, and well within a heartbeat's reach.
    assert await redis.hget(agent.keys.state(job_id), "cancel_requested_ms") is None
    assert time.monotonic() - t0 < 1.0
    assert not bystander.cancel_requested


async def test_cancel_through_the_client_reaches_the_runtime(
    agent: Agent, client: ClientAgent, redis: Redis, runtime: WorkerRuntime
) -> None:
    job_id = await started_job(client, agent)
    handle = runtime.track(job_id)
    await runtime.start()
    await eventually(lambda: subscribed(redis, agent), what="the runtime subscribes to the cancel channel")
    state = await client.cancel(job_id, wait_s=0)
    assert state is not None and state.status is JobStatus.STARTED

    async def flagged() -> bool:
        return handle.cancel_requested

    await eventually(flagged, timeout_s=2.0, what="the cancel reaches the handle")


# -- recovery --------------------------------------------------------------------------------------


async def lose(agent: Agent, redis: Redis, job_id: str) -> None:
    """Make a STARTED job look abandoned: lease run out, last transition long ago."""
    await redis.zadd(agent.keys.leases, {job_id: 1})
    await redis.zadd(agent.keys.active_index, {job_id: 1})


async def test_start_runs_a_recovery_pass_first(
    agent: Agent, client: ClientAgent, redis: Redis, runtime: WorkerRuntime
) -> None:
    job_id = await started_job(client, agent)
    await lose(agent, redis, job_id)
    await runtime.start()
    state = await agent.job_store.get(job_id)
    assert state is not None and state.status is JobStatus.FAILURE, "settled before start() returned"
    assert state.error == "WorkerLost: the worker was lost during attempt 1 (resume is off)"
    assert not await redis.exists(agent.keys.recovery_lock), "the pass released its lock"


async def test_recovery_runs_periodically(
    agent: Agent, client: ClientAgent, redis: Redis, runtime: WorkerRuntime
) -> None:
    await runtime.start()
    job_id = await started_job(client, agent)
    await lose(agent, redis, job_id)
    state = await wait_for_status(agent, job_id, JobStatus.FAILURE, timeout_s=5)
    assert state.error is not None and state.error.startswith("WorkerLost")


async def test_renewed_lease_keeps_a_job_out_of_recovery(agent: Agent, redis: Redis) -> None:
    """With a lease shorter than the test, only the heartbeat's renewals keep a tracked job STARTED;
    an untracked one beside it is recovered as lost."""
    async with Agent(dataclasses.replace(agent.settings, lease_s=LEASE_S)) as short:
        client = ClientAgent(short)
        tracked, untracked = [await started_job(client, short) for _ in range(2)]
        first_lease = await lease_of(redis, short, tracked)
        assert first_lease is not None
        for job_id in (tracked, untracked):  # idle long enough to be judged by every pass
            await redis.zadd(short.keys.active_index, {job_id: 1})
        recovery = CountingRecovery(short)
        rt = make_runtime(short, recovery)
        rt.track(tracked)
        try:
            await rt.start()
            await wait_for_status(short, untracked, JobStatus.FAILURE, timeout_s=5)

            async def first_lease_over() -> bool:
                return time.time() * 1000 > first_lease

            await eventually(first_lease_over, what="the first lease has run out")
            passes = recovery.passes
            await eventually(lambda: recovery.passes_at_least(passes + 2), what="two passes after it")
        finally:
            await rt.stop()
        state = await short.job_store.get(tracked)
        assert state is not None and state.status is JobStatus.STARTED
        lease = await lease_of(redis, short, tracked)
        assert lease is not None and lease > time.time() * 1000


class CountingRecovery(JobRecovery):
    """A real recovery that counts its passes, and fails the first `failures` of them."""

    def __init__(self, agent: Agent, failures: int = 0, error: type[Exception] = RuntimeError) -> None:
        super().__init__(agent.job_store, engine=agent.engine)
        self.passes = 0
        self.failures = failures
        self.error = error
        self.made = 0  # passes that took the lock

    async def reconcile_orphans(self, *, lock_ttl_s: float = 60.0, hold: bool = False) -> int | None:
        self.passes += 1
        if self.passes <= self.failures:
            raise self.error(f"pass {self.passes} failed")
        settled = await super().reconcile_orphans(lock_ttl_s=lock_ttl_s, hold=hold)
        if settled is not None:
            self.made += 1
        return settled

    async def passes_at_least(self, n: int) -> bool:
        return self.passes >= n


@pytest.mark.parametrize("error", [RuntimeError, RedisConnectionError])
async def test_failing_recovery_neither_stops_start_nor_the_loops(
    agent: Agent, client: ClientAgent, redis: Redis, error: type[Exception]
) -> None:
    """Start-up recovery failing (a bug, or Redis unreachable) is logged, not raised; the periodic
    pass keeps trying and settles the orphan once it works; the heartbeat runs all along."""
    recovery = CountingRecovery(agent, failures=3, error=error)
    rt = make_runtime(agent, recovery)
    orphan = await started_job(client, agent)
    await lose(agent, redis, orphan)
    live = await started_job(client, agent)
    before = await lease_of(redis, agent, live)
    rt.track(live)
    try:
        await rt.start()
        assert recovery.passes == 1
        await eventually(lambda: _moved(redis, agent, live, before), what="heartbeat despite failing recovery")
        await wait_for_status(agent, orphan, JobStatus.FAILURE, timeout_s=5)
    finally:
        await rt.stop()
    assert recovery.passes > recovery.failures


async def test_the_sweeps_run_after_the_passes_this_worker_makes_only(agent: Agent, redis: Redis) -> None:
    """The sweeps (owned blobs, pending finalizers) are namespace-wide chores, like the recovery
    pass: a worker whose pass finds the recovery lock held by another skips them too; once the lock
    is free its passes sweep again."""
    sweeps = 0

    async def sweep() -> int:
        nonlocal sweeps
        sweeps += 1
        return 0

    rt = WorkerRuntime(
        agent.job_store, recovery=JobRecovery(agent.job_store, engine=agent.engine), lease_s=LEASE_S,
        reconcile_interval_s=RECONCILE_S, sweeps=[sweep],
    )
    # Another worker's pass, held for the whole time this one runs a few of its own.
    await redis.set(agent.keys.recovery_lock, "another worker", px=60_000)
    try:
        await rt.start()
        await asyncio.sleep(RECONCILE_S * 4)
        assert sweeps == 0
        await redis.delete(agent.keys.recovery_lock)
        await eventually(lambda: _at_least(lambda: sweeps, 2), what="sweeps after the worker's own passes")
    finally:
        await rt.stop()


async def test_the_sweeps_run_after_every_third_pass(agent: Agent) -> None:
    """The first pass a worker makes sweeps, then every third one: the sweeps' reads are not paid at
    every pass."""
    sweeps = 0

    async def sweep() -> int:
        nonlocal sweeps
        sweeps += 1
        return 0

    recovery = CountingRecovery(agent)
    rt = WorkerRuntime(
        agent.job_store, recovery=recovery, lease_s=LEASE_S, reconcile_interval_s=RECONCILE_S, sweeps=[sweep],
    )
    try:
        await rt.start()
        await eventually(lambda: _at_least(lambda: recovery.made, 8), what="eight periodic passes")
    finally:
        await rt.stop()
    periodic = recovery.made - 1  # the start-up pass does not sweep
    assert periodic >= 7
    assert sweeps == (periodic + 2) // 3, (periodic, sweeps)


async def test_workers_of_a_namespace_make_one_periodic_pass_per_interval_between_them(agent: Agent) -> None:
    """A periodic pass keeps the recovery lock for most of the interval: two workers together make
    about one pass per interval, not one each."""
    recoveries = [CountingRecovery(agent), CountingRecovery(agent)]
    runtimes = [make_runtime(agent, recovery) for recovery in recoveries]
    window_s = RECONCILE_S * 10
    try:
        for rt in runtimes:
            await rt.start()
            await asyncio.sleep(RECONCILE_S / 2)  # out of step: their passes would not collide
        await asyncio.sleep(window_s)
    finally:
        for rt in runtimes:
            await rt.stop()
    made = sum(r.made for r in recoveries) - 2  # the start-up passes
    # Each worker alone would make about 10 in the window (about 20 between them).
    assert 5 <= made <= 14, made


async def _at_least(count: Callable[[], int], n: int) -> bool:
    return count() >= n


# -- stop ------------------------------------------------------------------------------------------


async def test_stop_ends_every_background_task(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    before = asyncio.all_tasks()
    rt = make_runtime(agent)
    await rt.start()
    spawned = asyncio.all_tasks() - before
    assert len(spawned) == 3, "heartbeat, cancel listener, recovery"
    await eventually(lambda: subscribed(redis, agent), what="subscribed")
    await rt.stop()
    assert all(task.done() for task in spawned)
    assert asyncio.all_tasks() - before == set()
    await eventually(lambda: _unsubscribed(redis, agent), what="the subscription is closed")
    # Stopped: a tracked job's lease is no longer renewed.
    job_id = await started_job(client, agent)
    rt.track(job_id)
    lease = await lease_of(redis, agent, job_id)
    await asyncio.sleep(3 * LEASE_S / 3)  # three heartbeat intervals: a running heartbeat would have renewed it
    assert await lease_of(redis, agent, job_id) == lease
    await rt.stop()  # stopping again is harmless


async def _unsubscribed(redis: Redis, agent: Agent) -> bool:
    return not await subscribed(redis, agent)


async def test_stop_before_start_is_harmless(agent: Agent) -> None:
    await make_runtime(agent).stop()
