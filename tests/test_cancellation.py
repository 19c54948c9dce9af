"""Two-phase cancellation and time limits on a live worker."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from redis.asyncio import Redis

from agent_async import Agent, ClientAgent, JobStatus
from tests.conftest import Drain, running_worker, wait_for_status
from tests.jobs import ChildSum, Deaf, Echo, Sleeper, Stubborn, runs_key


async def wait_for_run(redis: Redis, agent: Agent, job_id: str) -> None:
    for _ in range(500):
        if await redis.hget(runs_key(agent.keys.namespace), job_id):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} never ran")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


async def test_running_job_stops_cooperatively(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """Phase 1: the task is cancelled, process() cleans up in finally, state CANCELED, slot freed."""
    async with running_worker(agent):
        job_id = await client.enqueue(Sleeper(), "u")
        # Not STARTED: the claim writes that before process() runs, and a cancel landing before
        # process() enters its try has no cleanup to run.
        await wait_for_run(redis, agent, job_id)
        t0 = time.monotonic()
        state = await client.cancel(job_id)
        elapsed_s = time.monotonic() - t0
    assert state is not None and state.status is JobStatus.CANCELED
    assert state.error == "canceled while running (stopped cooperatively)"
    assert elapsed_s < agent.settings.cancel_grace_s, "a cooperative job stops before the grace ends"
    assert await redis.hget(runs_key(agent.keys.namespace) + ":cleanup", job_id) == b"1"
    assert await agent.job_store.slots_held(agent.keys.gate(Sleeper.name, "u")) == 0


async def test_blocking_child_is_killed_in_phase_two(agent: Agent, client: ClientAgent, tmp_path: Path) -> None:
    """Blocking work in run_in_child that ignores SIGTERM: SIGKILLed after the grace, within
    grace + 2 s of the cancel; CANCELED, slot freed, no child left."""
    marker = tmp_path / "child.pid"
    async with running_worker(agent):
        job_id = await client.enqueue(Stubborn(marker_path=str(marker)), "u")
        for _ in range(500):
            if marker.exists() and marker.read_text():
                break
            await asyncio.sleep(0.01)
        pid = int(marker.read_text())
        assert alive(pid)
        t0 = time.monotonic()
        state = await client.cancel(job_id)
        elapsed_s = time.monotonic() - t0
    assert state is not None and state.status is JobStatus.CANCELED
    assert state.error is not None and "stopped hard" in state.error and "1 child process(es) killed" in state.error
    assert agent.settings.cancel_grace_s <= elapsed_s < agent.settings.cancel_grace_s + 2
    assert not alive(pid)
    assert await agent.job_store.slots_held(agent.keys.gate(Stubborn.name, "u")) == 0


async def test_async_job_ignoring_cancellation_is_abandoned(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """A coroutine that swallows CancelledError cannot be killed: it is abandoned and the job ends
    CANCELED anyway, so the worker and the slot are free."""
    async with running_worker(agent):
        job_id = await client.enqueue(Deaf(), "u")
        # Inside process() (STARTED is written by the claim, before process() runs: a cancel then
        # would stop the job before it could ignore it).
        await wait_for_run(redis, agent, job_id)
        state = await client.cancel(job_id)
        assert state is not None and state.status is JobStatus.CANCELED
        assert state.error is not None and "abandoned" in state.error
        # The worker still serves other jobs.
        other = await client.enqueue(Echo(text="next"))
        assert (await wait_for_status(agent, other, JobStatus.SUCCESS)).result == {
            "echo": "next",
            "sum": 0,
            "user": None,
        }


async def test_hard_time_limit_stops_a_job_that_ignores_the_soft_one(
    drain: Drain, agent: Agent, client: ClientAgent
) -> None:
    """Soft limit 0.3 s ignored: the hard limit (soft + grace) ends it, and the error says which."""
    job_id = await client.enqueue(Deaf())
    t0 = time.monotonic()
    await drain()
    elapsed_s = time.monotonic() - t0
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.error is not None and state.error.startswith("HardTimeLimitExceeded: hard time limit of 0.8s")
    assert elapsed_s < 0.3 + agent.settings.hard_timeout_grace_s + 2


async def test_deferred_job_canceled_never_runs(drain: Drain, agent: Agent, client: ClientAgent, redis: Redis) -> None:
    job_id = await client.enqueue(Echo(), defer_s=0.3)
    state = await client.cancel(job_id)
    assert state is not None and state.status is JobStatus.CANCELED
    await asyncio.sleep(0.35)
    await drain()
    assert await redis.hget(runs_key(agent.keys.namespace), job_id) is None
    assert (await client.get_state(job_id)).status is JobStatus.CANCELED  # type: ignore[union-attr]


async def test_no_stale_cancel_reaches_a_later_job(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """Cancels of finished, unknown and already-canceled jobs leave nothing that aborts later jobs."""
    done = await client.enqueue(Echo())
    await drain()
    await client.cancel(done)
    await client.cancel("never-existed")
    later = [await client.enqueue(Echo(text=str(i))) for i in range(5)]
    await drain()
    for job_id in later:
        assert (await client.get_state(job_id)).status is JobStatus.SUCCESS  # type: ignore[union-attr]
    assert await redis.zcard("arq:abort") == 0 or not [
        m async for m in redis.zscan_iter("arq:abort", match=f"{agent.keys.namespace}:*")
    ]


async def test_run_in_child_returns_the_result(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(ChildSum())
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS and state.result == {"sum": 5}
