"""arq behaviours this layer absorbs: raising hooks, hook-less drops, pickup-counted tries, pickle."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from agent_async import Agent, ClientAgent, JobStatus
from agent_async.engine import hooks
from agent_async.engine.stoppable import StoppableWorker
from agent_async.lifecycle import StartDecision
from agent_async.worker import JobRecovery
from tests.conftest import Drain, run_burst
from tests.jobs import Amnesia, Echo, Flaky, Gated, NoWorker, Sleeper, runs_key


async def runs(redis: Redis, agent: Agent, job_id: str) -> int:
    return int(await redis.hget(runs_key(agent.keys.namespace), job_id) or 0)


@pytest.mark.parametrize("error", [RedisConnectionError("redis hiccup"), ResponseError("ERR a refused script")])
async def test_failing_start_hook_neither_kills_the_worker_nor_runs_untracked(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis, monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    """If recording STARTED fails, the hook swallows it: an outage error is sent again (it may have
    run: tests/test_lost_replies.py), any other error sends the job back to the queue. Either way
    it runs exactly once when Redis answers again; the worker keeps serving the other jobs."""
    failing_id = await client.enqueue(Echo(text="a"))
    other_id = await client.enqueue(Echo(text="b"))
    original = agent.job_store.start
    failures = {"left": 1}

    async def flaky_start(job_id: str, **kwargs: Any) -> StartDecision:
        if job_id == failing_id and failures["left"]:
            failures["left"] -= 1
            raise error
        return await original(job_id, **kwargs)

    monkeypatch.setattr(agent.job_store, "start", flaky_start)
    await drain()
    for job_id in (failing_id, other_id):
        state = await client.get_state(job_id)
        assert state is not None and state.status is JobStatus.SUCCESS
        assert await runs(redis, agent, job_id) == 1
        assert state.attempts == 1


async def test_failing_end_hook_does_not_run_the_job_twice(
    agent: Agent, client: ClientAgent, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transient failure recording the outcome is retried inside the hook; the job ran once."""
    job_id = await client.enqueue(Echo(text="x"))
    original = agent.job_store.transition
    failures = {"left": 2}

    async def flaky_transition(*args, **kwargs):  # type: ignore[no-untyped-def]
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("redis hiccup")
        return await original(*args, **kwargs)

    monkeypatch.setattr(agent.job_store, "transition", flaky_transition)
    await run_burst(agent, "arq_cli_worker")
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS
    assert await runs(redis, agent, job_id) == 1


async def test_end_hook_that_never_succeeds_leaves_state_for_the_reconciler(
    agent: Agent, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis refusing every outcome write for longer than the worker keeps retrying it: the worker
    survives, the job ran once, and the state is ended by the reconciler instead of staying
    STARTED forever. (The burst worker makes no periodic pass here: on a loaded machine the burst
    can outlast the reconciler's idle grace, 1 s, and its own pass would end the state first.)"""
    async with Agent(dataclasses.replace(agent.settings, reconcile_interval_s=60)) as quiet:
        client = ClientAgent(quiet)
        job_id = await client.enqueue(Gated(), "u")
        original = quiet.job_store.run

        async def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise ConnectionError("redis down")

        monkeypatch.setattr(hooks, "OUTCOME_RETRY_FOR_S", 0.3)
        monkeypatch.setattr(quiet.job_store, "run", broken)
        await run_burst(quiet, "arq_cli_worker")
        assert await runs(redis, quiet, job_id) == 1
        assert (await client.get_state(job_id)).status is JobStatus.STARTED  # type: ignore[union-attr]
        monkeypatch.setattr(quiet.job_store, "run", original)
        assert await JobRecovery(quiet.job_store, engine=quiet.engine).reconcile(idle_for_ms=0) == 1
        state = await client.get_state(job_id)
        assert state is not None and state.status is JobStatus.FAILURE
        assert await quiet.job_store.slots_held(quiet.keys.gate(Gated.name, "u")) == 0


async def _dropped(drain: Drain, agent: Agent, client: ClientAgent, job_id: str) -> str:
    """Drain, then let the reconciler look: the job must end FAILURE whichever worker ran.

    The agent worker ends it in arq's own finish transaction; under the plain arq worker no hook
    runs and the reconciler ends it.
    """
    await drain()
    await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0)
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE and state.error is not None
    assert state.attempts == 0, "the job never ran"
    assert await agent.job_store.active_job_ids() == []
    return state.error


async def test_unknown_function_ends_failure(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    """arq drops a job whose function the worker lacks without any hook: it still ends FAILURE."""
    job_id = await client.enqueue(NoWorker(), "u")
    error = await _dropped(drain, agent, client, job_id)
    assert "function 'tests.no_worker' not found" in error


async def test_max_tries_exceeded_ends_failure(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """arq's own try limit (pickups, under arq's stock worker) dropping a job without a hook still
    ends its state."""
    job_id = await client.enqueue(Echo())
    await redis.set(f"arq:retry:{agent.engine.names.engine_job_id(job_id)}", 100)
    error = await _dropped(lambda: run_burst(agent, "arq_cli_worker"), agent, client, job_id)
    assert "retries exceeded" in error


async def test_the_fast_worker_counts_tries_in_the_state_not_arqs_key(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """The fast worker's try is the state's attempt: a stray arq tries count does not drop the job."""
    job_id = await client.enqueue(Echo(text="runs"))
    await redis.set(f"arq:retry:{agent.engine.names.engine_job_id(job_id)}", 100)
    await run_burst(agent, "agent_worker")
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS and state.attempts == 1
    assert await runs(redis, agent, job_id) == 1


async def test_expired_job_key_ends_failure(drain: Drain, agent: Agent, client: ClientAgent, redis: Redis) -> None:
    job_id = await client.enqueue(Echo())
    await redis.delete(f"arq:job:{agent.engine.names.engine_job_id(job_id)}")
    error = await _dropped(drain, agent, client, job_id)
    assert "job expired" in error


async def test_payload_that_does_not_deserialize_ends_failure(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis, tmp_path: Path
) -> None:
    """A pickle planted in the job key is never unpickled (it would create a file): the job fails."""
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (Path.touch, (marker,))

    job_id = await client.enqueue(Echo())
    await redis.set(f"arq:job:{agent.engine.names.engine_job_id(job_id)}", pickle.dumps(Exploit()))
    error = await _dropped(drain, agent, client, job_id)
    assert "deserialize" in error
    assert not marker.exists()


async def test_worker_sweeps_dropped_jobs_on_its_own(agent: Agent, client: ClientAgent) -> None:
    """The running worker's background reconciler ends a dropped job without any test help."""
    job_id = await client.enqueue(NoWorker(), "u")
    worker = asyncio.create_task(agent.run_worker(poll_delay=0.01, handle_signals=False))
    try:
        for _ in range(200):  # up to 10 s
            if (await client.get_state(job_id)).status is not JobStatus.PENDING:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
    assert (await client.get_state(job_id)).status is JobStatus.FAILURE  # type: ignore[union-attr]


async def test_attempts_count_runs_not_pickups(drain: Drain, agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """arq's job_try already at 3 (earlier pickups) does not eat into max_try: 3 real attempts."""
    job_id = await client.enqueue(Flaky(fail_times=10))
    await redis.set(f"arq:retry:{agent.engine.names.engine_job_id(job_id)}", 3)
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.attempts == 3
    assert await runs(redis, agent, job_id) == 3


async def test_agent_worker_ends_dropped_jobs_in_arqs_own_transaction(agent: Agent, client: ClientAgent) -> None:
    """With Agent.run_worker no reconciler pass is needed: the drop and the FAILURE commit together."""
    job_id = await client.enqueue(NoWorker(), "u")
    await run_burst(agent, "agent_worker")
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert state.error is not None and "not found" in state.error
    assert await agent.job_store.slots_held(agent.keys.gate(NoWorker.name, "u")) == 0


async def test_failed_finish_transaction_keeps_the_worker_alive(
    agent: Agent, client: ClientAgent, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the outcome cannot be committed with arq's finish (a Redis error in its transition), the
    worker logs it and goes on with the next job; the reconciler then ends the state."""
    first = await client.enqueue(Echo(text="first"))
    original = agent.job_store.transition_of
    poisoned = {"left": 1}
    wrong = "wrongtype-" + agent.keys.namespace

    def poison(job_id: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        transition = original(job_id, *args, **kwargs)
        if poisoned["left"]:
            poisoned["left"] -= 1
            # A state key of the wrong type makes the transition fail, before any write.
            return dataclasses.replace(transition, job_id=wrong)
        return transition

    await redis.set(agent.keys.state(wrong), "x")
    monkeypatch.setattr(agent.job_store, "transition_of", poison)
    second = await client.enqueue(Echo(text="second"))
    await run_burst(agent, "agent_worker")
    await redis.delete(agent.keys.state(wrong))
    states = [s for s in [await client.get_state(j) for j in (first, second)] if s]
    lost = [s for s in states if s.status is not JobStatus.SUCCESS]
    assert len(states) == 2 and len(lost) == 1, states
    # The job whose outcome could not be committed is left STARTED, unless the worker's own
    # reconcile pass (every reconcile_interval_s) already ended it while the burst was still going.
    assert lost[0].status in (JobStatus.STARTED, JobStatus.FAILURE), lost[0]
    reconciled = await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0)
    assert reconciled == (1 if lost[0].status is JobStatus.STARTED else 0)
    for job_id in (first, second):
        assert (await client.get_state(job_id)).is_terminal  # type: ignore[union-attr]
    assert await runs(redis, agent, first) == 1 and await runs(redis, agent, second) == 1


async def test_scripts_lost_mid_run_still_record_the_outcome(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """Redis forgetting our Lua scripts (restart, SCRIPT FLUSH) while a job runs: its outcome is
    still recorded, once, and the next enqueue works."""
    job_id = await client.enqueue(Amnesia())
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS and state.result == {"remembered": True}
    assert await runs(redis, agent, job_id) == 1
    assert await client.enqueue(Echo())


async def test_stock_worker_close_waits_for_running_jobs_past_a_failed_one(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """arq's close() gathers its job tasks and lets the first error out: a job whose finish met a
    Redis error (Redis went away as it ended, seen in the fault suite) cut the wait short, and
    on_shutdown then interrupted jobs that were about to end (FAILURE, resume is off). The stock
    worker's close waits for every running job whatever happened to the others."""
    failing_id = await client.enqueue(Sleeper(sleep_s=0.3))
    running_id = await client.enqueue(Sleeper(sleep_s=1.0))
    worker = StoppableWorker(**agent.worker_settings(burst=False))
    original = worker.finish_job

    async def finish_job(engine_id: str, *args: object) -> None:
        if agent.engine.names.job_id(engine_id) == failing_id:
            raise RedisConnectionError("Redis went away during arq's finish transaction")
        await original(engine_id, *args)

    worker.finish_job = finish_job  # type: ignore[method-assign]
    # The loop ends as it does on a Redis error (arq #498), raised where an iteration begins. Not
    # a cancel: the loop spends its time in arq's per-job WATCH transaction over the two queued
    # ids, and redis-py < 6 (arq pins it) leaks the connection of a pipeline cancelled in its
    # reset (redis-py #4121), a ResourceWarning whenever the collector finds it.
    redis_gone = False
    poll_iteration = worker._poll_iteration

    async def _poll_iteration() -> None:
        if redis_gone:
            raise RedisConnectionError("Redis went away between two polls")
        await poll_iteration()

    worker._poll_iteration = _poll_iteration  # type: ignore[method-assign]
    loop_task = asyncio.create_task(worker.main())

    async def both_running() -> bool:
        states = [await client.get_state(job_id) for job_id in (failing_id, running_id)]
        return all(s is not None and s.status is JobStatus.STARTED for s in states)

    for _ in range(200):
        if await both_running():
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the worker did not start both jobs")
    # Then, as Agent.run_worker does, close while both jobs run: the first one's finish fails
    # during close's wait.
    redis_gone = True
    with pytest.raises(RedisConnectionError):
        await loop_task
    await worker.close()
    state = await client.get_state(running_id)
    assert state is not None and state.status is JobStatus.SUCCESS, state
    assert await runs(redis, agent, running_id) == 1
