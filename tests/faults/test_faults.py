"""Fault injection with real worker processes: SIGKILLs, cancel storms, a Redis restart, blocking work.

Every loop is bounded in count and time. The figures each test measures are printed at the end of
the run ("fault-injection figures: {...}").
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from agent_async import Agent, AgentSettings, ClientAgent, JobState, JobStatus
from tests.conftest import REDIS_URL
from tests.faults.conftest import FIGURES, PrivateRedis
from tests.faults.jobs import (
    Blocking,
    CountThenSleep,
    FanoutFinal,
    OnceUpsert,
    ResumeUpsert,
    effects_key,
    finals_key,
    runs_key,
)

pytestmark = pytest.mark.slow

KILLS = 10
JOBS = 200


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Poll `check` until it holds; returns the time it took; fails the test after `timeout_s`."""
    t0 = time.monotonic()
    while not await check():
        if time.monotonic() - t0 > timeout_s:
            pytest.fail(f"{what}: not reached within {timeout_s}s")
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def all_states(agent: Agent, ids: list[str]) -> list[JobState]:
    states = await agent.job_store.get_many(ids)
    assert all(s is not None for s in states), "a state vanished"
    return [s for s in states if s is not None]


async def kill_loop(agent: Agent, ids: list[str], workers: object, rng: random.Random) -> list[float]:
    """SIGKILL the worker KILLS times at random moments of its work, restarting it each time;
    returns, per kill, how long until every job it was running had been taken back."""
    client = ClientAgent(agent)

    async def registered(pid: int) -> bool:
        return any(worker.pid == pid for worker in await client.workers())

    proc = workers.start()  # type: ignore[attr-defined]
    detections = []
    for _ in range(KILLS):
        # Killed once it works, not while it imports: a loaded machine can take longer to start
        # a worker than the pause below, and then no kill would hit a running job.
        await until(lambda pid=proc.pid: registered(pid), 30, "the worker registered")  # type: ignore[misc]
        await asyncio.sleep(rng.uniform(0.4, 0.9))
        before = {s.job_id: s.attempts for s in await all_states(agent, ids) if s.status is JobStatus.STARTED}
        workers.kill(proc)  # type: ignore[attr-defined]
        killed_at = time.monotonic()
        proc = workers.start()  # type: ignore[attr-defined]

        async def taken_back(before: dict[str, int] = before) -> bool:
            states = await agent.job_store.get_many(list(before))
            return all(
                s is not None and (s.status is not JobStatus.STARTED or s.attempts > before[s.job_id]) for s in states
            )

        await until(taken_back, 20, "jobs of a killed worker taken back")
        if before:
            detections.append(time.monotonic() - killed_at)
    return detections


async def settled(agent: Agent, ids: list[str]) -> bool:
    return all(s.is_terminal for s in await all_states(agent, ids))


async def test_sigkilled_workers_lose_nothing_with_resume(
    agent: Agent, client: ClientAgent, redis: Redis, workers: object, namespace: str
) -> None:
    """200 resume=True jobs, 10 SIGKILLs: all SUCCESS, each side effect exactly once, no slot held,
    nothing left non-terminal."""
    rng = random.Random(2026)
    ids = [await client.enqueue(ResumeUpsert(duration_s=rng.uniform(0.05, 0.3)), "u") for _ in range(JOBS)]
    detections = await kill_loop(agent, ids, workers(namespace, REDIS_URL), rng)  # type: ignore[operator]
    await until(lambda: settled(agent, ids), 60, "all jobs terminal")

    states = await all_states(agent, ids)
    lost = [s for s in states if s.status is not JobStatus.SUCCESS]
    effects = await redis.hgetall(effects_key(namespace))
    runs = {k.decode(): int(v) for k, v in (await redis.hgetall(runs_key(namespace))).items()}
    leaked = await agent.job_store.slots_held(agent.keys.gate(ResumeUpsert.name, "u"))
    FIGURES["sigkill_resume"] = {
        "jobs": JOBS,
        "kills": KILLS,
        "lost": len(lost),
        "duplicated_side_effects": len(effects) - len(set(effects)),
        "leaked_slots": leaked,
        "reruns": sum(n - 1 for n in runs.values()),
        "max_detect_dead_worker_s": round(max(detections, default=0.0), 2),
    }
    assert lost == []
    assert set(k.decode() for k in effects) == set(ids)
    assert leaked == 0
    assert await agent.job_store.active_job_ids() == []
    assert max(detections) < agent.settings.reconcile_interval_s + 1.2 + 3, "dead worker noticed fast"


async def test_sigkilled_workers_never_rerun_without_resume(
    agent: Agent, client: ClientAgent, redis: Redis, workers: object, namespace: str
) -> None:
    """resume=False: every job ends SUCCESS or FAILURE (worker lost); none is left STARTED and none
    ran twice."""
    rng = random.Random(7)
    ids = [await client.enqueue(OnceUpsert(duration_s=rng.uniform(0.05, 0.3)), "u") for _ in range(JOBS)]
    detections = await kill_loop(agent, ids, workers(namespace, REDIS_URL), rng)  # type: ignore[operator]
    await until(lambda: settled(agent, ids), 60, "all jobs terminal")

    states = await all_states(agent, ids)
    runs = {k.decode(): int(v) for k, v in (await redis.hgetall(runs_key(namespace))).items()}
    lost = [s for s in states if s.status is JobStatus.FAILURE]
    FIGURES["sigkill_no_resume"] = {
        "jobs": JOBS,
        "kills": KILLS,
        "failed_worker_lost": len(lost),
        "ran_twice": sum(n > 1 for n in runs.values()),
        "leaked_slots": await agent.job_store.slots_held(agent.keys.gate(OnceUpsert.name, "u")),
        "max_detect_dead_worker_s": round(max(detections, default=0.0), 2),
    }
    assert {s.status for s in states} <= {JobStatus.SUCCESS, JobStatus.FAILURE}
    assert all(s.error is not None and s.error.startswith("WorkerLost") for s in lost)
    assert max(runs.values()) == 1
    assert FIGURES["sigkill_no_resume"]["leaked_slots"] == 0
    assert lost, "the kills hit running jobs (otherwise this test proves nothing)"


async def test_cancel_storm(agent: Agent, client: ClientAgent, workers: object, namespace: str) -> None:
    """Two workers; 100 cancels at random points (queued, deferred, running, finished), and 3 of
    long jobs once they run. Each ends CANCELED or had finished; jobs enqueued afterwards all
    succeed (no stale cancel)."""
    rng = random.Random(11)
    group = workers(namespace, REDIS_URL)  # type: ignore[operator]
    group.start()
    group.start()
    # A few long jobs, each cancelled once it runs: the storm's random timing alone hits a running
    # job only a few times in 100 (none at all in some runs), and that path must be exercised.
    long_ids = [await client.enqueue(ResumeUpsert(duration_s=3.0), "u") for _ in range(3)]
    ids = []
    for _ in range(300):
        defer_s = rng.choice([0, 0, 0, rng.uniform(0.2, 1.5)])
        ids.append(await client.enqueue(ResumeUpsert(duration_s=rng.uniform(0.05, 0.6)), "u", defer_s=defer_s))
    targets = rng.sample(ids, 100)
    running_stop_s: list[float] = []
    outcomes: dict[JobStatus, int] = {}

    async def cancel_later(job_id: str) -> None:
        await asyncio.sleep(rng.uniform(0, 3))
        before = await client.get_state(job_id)
        t0 = time.monotonic()
        after = await client.cancel(job_id)
        assert after is not None
        if before is not None and before.status is JobStatus.STARTED and after.status is JobStatus.CANCELED:
            running_stop_s.append(time.monotonic() - t0)
        outcomes[after.status] = outcomes.get(after.status, 0) + 1

    async def cancel_when_running(job_id: str) -> None:
        async def started() -> bool:
            state = await client.get_state(job_id)
            return state is not None and state.status is JobStatus.STARTED

        await until(started, 30, "a long job started")
        t0 = time.monotonic()
        after = await client.cancel(job_id)
        assert after is not None and after.status is JobStatus.CANCELED, after
        running_stop_s.append(time.monotonic() - t0)
        outcomes[after.status] = outcomes.get(after.status, 0) + 1

    await asyncio.gather(*(cancel_later(j) for j in targets), *(cancel_when_running(j) for j in long_ids))
    targets += long_ids
    ids += long_ids
    await until(lambda: settled(agent, ids), 60, "all jobs terminal")
    states = {s.job_id: s for s in await all_states(agent, ids)}
    for job_id in targets:
        assert states[job_id].status in (JobStatus.CANCELED, JobStatus.SUCCESS), states[job_id]
    for job_id in set(ids) - set(targets):
        assert states[job_id].status is JobStatus.SUCCESS, states[job_id]
    later = [await client.enqueue(ResumeUpsert(duration_s=0.01), "u") for _ in range(50)]
    await until(lambda: settled(agent, later), 30, "later jobs terminal")
    assert {s.status for s in await all_states(agent, later)} == {JobStatus.SUCCESS}
    FIGURES["cancel_storm"] = {
        "cancels": len(targets),
        "canceled": outcomes.get(JobStatus.CANCELED, 0),
        "already_finished": outcomes.get(JobStatus.SUCCESS, 0),
        "running_canceled": len(running_stop_s),
        "max_cancel_to_canceled_running_s": round(max(running_stop_s, default=0.0), 3),
        "leaked_slots": await agent.job_store.slots_held(agent.keys.gate(ResumeUpsert.name, "u")),
    }
    assert running_stop_s, "some cancels hit running jobs"
    assert FIGURES["cancel_storm"]["leaked_slots"] == 0


async def test_worker_survives_a_redis_restart(private_redis: PrivateRedis, workers: object, namespace: str) -> None:
    """Redis restarted under a running worker: the worker reconnects and drains the whole queue."""
    async with Agent(AgentSettings(redis_url=private_redis.url, namespace=namespace)) as agent:
        client = ClientAgent(agent)
        ids = [await client.enqueue(ResumeUpsert(duration_s=0.05)) for _ in range(150)]
        group = workers(namespace, private_redis.url)  # type: ignore[operator]
        proc = group.start()

        async def some_done() -> bool:
            return sum(s.status is JobStatus.SUCCESS for s in await all_states(agent, ids)) >= 20

        await until(some_done, 30, "first jobs done")
        private_redis.stop()
        await asyncio.sleep(1.5)
        private_redis.start()

        async def all_done() -> bool:
            try:
                return all(s.status is JobStatus.SUCCESS for s in await all_states(agent, ids))
            except (RedisConnectionError, ConnectionError, OSError):
                return False

        try:
            recovery_s = await until(all_done, 60, "queue drained after the restart")
        except BaseException:
            stuck = [(s.job_id, s.status, s.attempts, s.error) for s in await all_states(agent, ids)
                     if s.status is not JobStatus.SUCCESS]
            print("not SUCCESS after the restart:", stuck)
            raise
        assert proc.poll() is None, "the worker process is still running"
        FIGURES["redis_restart"] = {"jobs": len(ids), "drained_after_restart_s": round(recovery_s, 2), "lost": 0}


async def test_blocking_job_is_stopped_hard(
    agent: Agent, client: ClientAgent, workers: object, namespace: str, tmp_path: Path
) -> None:
    """Blocking CPU work that ignores SIGTERM, in run_in_child: cancel stops it within grace + 2 s
    and its process is gone."""
    group = workers(namespace, REDIS_URL)  # type: ignore[operator]
    group.start()
    marker = tmp_path / "blocking.pid"
    job_id = await client.enqueue(Blocking(seconds=60, marker_path=str(marker)))

    async def started() -> bool:
        return marker.exists() and bool(marker.read_text())

    await until(started, 20, "blocking child running")
    child = psutil.Process(int(marker.read_text()))
    assert child.is_running()
    t0 = time.monotonic()
    state = await client.cancel(job_id)
    stop_s = time.monotonic() - t0
    assert state is not None and state.status is JobStatus.CANCELED
    assert state.error is not None and "stopped hard" in state.error
    grace_s = 0.5
    assert stop_s < grace_s + 2
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    FIGURES["blocking_cancel"] = {"cancel_to_canceled_s": round(stop_s, 2), "grace_s": grace_s}


async def test_sigterm_drains_then_hands_back_per_resume(
    agent: Agent, client: ClientAgent, workers: object, namespace: str
) -> None:
    """SIGTERM: the worker stops taking jobs, lets running ones finish within the drain time (2 s
    here), then hands the rest back: a resume=True job runs again on the next worker, a
    resume=False one ends FAILURE; nothing stays STARTED."""
    group = workers(namespace, REDIS_URL)  # type: ignore[operator]
    proc = group.start()
    short = await client.enqueue(OnceUpsert(duration_s=0.5))
    long_resume = await client.enqueue(ResumeUpsert(duration_s=4))
    long_once = await client.enqueue(OnceUpsert(duration_s=4))

    async def all_started() -> bool:
        return all(s.status is JobStatus.STARTED for s in await all_states(agent, [short, long_resume, long_once]))

    await until(all_started, 20, "three jobs running")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)
    states = {s.job_id: s for s in await all_states(agent, [short, long_resume, long_once])}
    assert states[short].status is JobStatus.SUCCESS, "finished within the drain time"
    assert states[long_once].status is JobStatus.FAILURE
    assert states[long_once].error == "WorkerShutdown: interrupted by worker shutdown (resume is off)"
    assert states[long_resume].status is JobStatus.PENDING
    group.start()
    await until(lambda: settled(agent, [long_resume]), 20, "handed-back job run again")
    resumed = await client.get_state(long_resume)
    assert resumed is not None and resumed.status is JobStatus.SUCCESS and resumed.attempts == 2


@pytest.mark.parametrize("kind", ["fast", "stock"])
async def test_outcomes_are_kept_through_a_redis_restart(
    private_redis: PrivateRedis, workers: object, namespace: str, kind: str
) -> None:
    """Redis restarts while jobs are finishing: a worker that stays alive keeps each outcome and
    writes it once Redis answers (lease kept renewed meanwhile): every job ends SUCCESS with its
    result, none runs twice. The stock Worker's process exits on a Redis error (arq #498); like a
    supervisor, the test starts a new one, and the old one still writes its outcomes first."""
    rng = random.Random(7)
    settings = AgentSettings(redis_url=private_redis.url, namespace=namespace)
    async with Agent(settings) as agent:
        client = ClientAgent(agent)
        ids = [await client.enqueue(CountThenSleep(duration_s=rng.uniform(0.3, 1.0))) for _ in range(60)]
        # A lease longer than the outage: the jobs are not lost, their outcomes are only late.
        group = workers(  # type: ignore[operator]
            namespace, private_redis.url, AGENT_LEASE_SECONDS="8", AGENT_WORKER_MAX_JOBS="20", FAULT_WORKER_KIND=kind
        )
        group.start()

        async def many_running() -> bool:
            # ...and every job started so far has counted its run: the fast worker's claim writes
            # STARTED before the body runs, and a body whose own Redis call meets the outage fails,
            # which is not what this test is about.
            started = sum(s.status is not JobStatus.PENDING for s in await all_states(agent, ids))
            return started >= 15 and len(await agent.redis.hgetall(runs_key(namespace))) >= started

        await until(many_running, 30, "jobs running")
        private_redis.stop()
        await asyncio.sleep(1.0)
        private_redis.start()

        async def all_terminal() -> bool:
            if all(proc.poll() is not None for proc in group.procs):
                group.start()  # the supervisor's restart
            try:
                return all(s.is_terminal for s in await all_states(agent, ids))
            except (RedisConnectionError, ConnectionError, OSError):
                return False

        await until(all_terminal, 60, "every job terminal after the restart")
        states = await all_states(agent, ids)
        runs = await agent.redis.hgetall(runs_key(namespace))
        bad = [(s.job_id, s.status, s.error) for s in states if s.status is not JobStatus.SUCCESS or not s.result]
        assert bad == [], f"outcomes lost or wrong: {bad}"
        assert sorted({int(n) for n in runs.values()}) == [1], "a job ran twice (or never counted its run)"
        assert len(runs) == len(ids)
        FIGURES[f"outcomes_through_redis_restart_{kind}"] = {"jobs": len(ids), "lost": 0, "ran_twice": 0}


async def test_fanout_finalizer_exactly_once_through_sigkills(
    agent: Agent, client: ClientAgent, redis: Redis, workers: object, namespace: str
) -> None:
    """A group of 200 resume=True children, 20 in flight, while the worker is SIGKILLed 10 times:
    every child counted once, the finalizer queued once (one job id) with the right counts."""
    rng = random.Random(11)
    children = [ResumeUpsert(duration_s=rng.uniform(0.05, 0.3)) for _ in range(JOBS)]
    group_id = await client.enqueue_group(children, FanoutFinal(), user_uid="u", max_in_flight=20)
    view = await client.get_group(group_id)
    assert view is not None
    final_id = view.finalizer_job_id

    async def child_ids() -> list[str]:
        return [s.job_id for s in await agent.job_store.list_for_user("u", limit=JOBS + 10) if s.job_id != final_id]

    proc_group = workers(namespace, REDIS_URL)  # type: ignore[operator]
    proc = proc_group.start()
    kills = 0
    for _ in range(KILLS):
        await asyncio.sleep(rng.uniform(0.4, 0.9))
        proc_group.kill(proc)
        kills += 1
        proc = proc_group.start()

    async def finalized() -> bool:
        state = await client.get_state(final_id)
        return state is not None and state.status is JobStatus.SUCCESS

    await until(finalized, 90, "the finalizer ran")
    view = await client.get_group(group_id)
    assert view is not None and (view.succeeded, view.failed, view.canceled) == (JOBS, 0, 0)
    ids = await child_ids()
    assert len(ids) == JOBS and len(set(ids)) == JOBS
    finals = {k.decode(): json.loads(v) for k, v in (await redis.hgetall(finals_key(namespace))).items()}
    assert list(finals) == [final_id], "one finalizer job, queued once"
    assert finals[final_id] == {"succeeded": JOBS, "failed": 0, "canceled": 0}
    effects = await redis.hlen(effects_key(namespace))
    assert effects == JOBS
    FIGURES["fanout_sigkill"] = {
        "children": JOBS, "max_in_flight": 20, "kills": kills, "finalizers_queued": len(finals),
        "lost_finalizers": 0, "doubled_finalizers": len(finals) - 1, "counted_succeeded": view.succeeded,
    }
