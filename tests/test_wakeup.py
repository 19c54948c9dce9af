"""Push wake-up of the fast worker: an idle worker blocks in Redis and starts a job about one round
trip after it is queued, whatever poll_delay says; deferred jobs, retries and cron ticks still
start on time; an idle worker costs Redis almost nothing; it stops and survives Redis as before."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, EnqueueResult, JobStatus
from agent_async.engine.claim import SERVER_NOW, claim_call, parse_claim
from agent_async.engine.wakeup import Waker
from agent_async.engine.wire import WAKE_CAP, WAKE_TTL_MS
from agent_async.schedules.overrides import ScheduleOverrides
from agent_async.storage import upgrade_async
from agent_async.store import ScriptCall, run_script
from agent_async.store.scripts import load_scripts
from tests.conftest import running_worker, wait_for_status
from tests.faults.conftest import ROOT, PrivateRedis, fault_env
from tests.faults.svc.jobs.sleep import Sleep
from tests.jobs import Echo, Flaky, Ticking

# Far above the start latency push wake-up gives, far below what polling every second gives.
POLL_DELAY_S = 1.0
STARTED_WITHIN_S = 0.2


@pytest.fixture
def settings(settings: AgentSettings) -> AgentSettings:
    # A poll delay so long that only a push can start a job quickly; a long block so that only a
    # deadline (deferred job, retry, cron) can end an idle wait early.
    return dataclasses.replace(settings, poll_delay_s=POLL_DELAY_S, worker_max_block_s=30.0)



async def until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s}s")
        await asyncio.sleep(0.01)


async def test_idle_worker_starts_a_job_well_under_poll_delay(agent: Agent, client: ClientAgent) -> None:
    """Five jobs queued one at a time to an idle worker polling every second: each starts at once."""
    async with running_worker(agent, poll_delay=POLL_DELAY_S):
        await asyncio.sleep(0.3)  # the worker is idle, blocked in Redis
        waits_s = []
        for _ in range(5):
            job_id = await client.enqueue(Echo(text="hi"))
            state = await wait_for_status(agent, job_id, JobStatus.SUCCESS, poll_s=0.005)
            assert state.started_ms is not None
            waits_s.append((state.started_ms - state.created_ms) / 1000)
            await asyncio.sleep(0.05)
    assert max(waits_s) < STARTED_WITHIN_S, waits_s


async def test_the_wake_list_is_capped_expires_and_is_dropped_once_stale(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """One token per job queued, trimmed back to WAKE_CAP once it holds twice as many, with an
    expiry: it cannot grow while no worker reads it. A worker that finds nothing left to claim
    drops the stale tokens. (A batch drops at most WAKE_CAP tokens for all its jobs.)"""
    key = agent.engine.names.wake_key
    results = await client.enqueue_many([Echo(text=str(i)) for i in range(WAKE_CAP + 10)])
    assert await redis.llen(key) == WAKE_CAP
    lengths = []
    for i in range(3 * WAKE_CAP):
        results.append(EnqueueResult(await client.enqueue(Echo(text=f"one {i}"))))
        lengths.append(await redis.llen(key))
    assert max(lengths) == 2 * WAKE_CAP - 1 and min(lengths) == WAKE_CAP
    assert 0 < await redis.pttl(key) <= WAKE_TTL_MS
    async with running_worker(agent, poll_delay=POLL_DELAY_S):
        for result in results:
            await wait_for_status(agent, result.job_id or "", JobStatus.SUCCESS)

        async def dropped() -> bool:
            return not await redis.exists(key)

        await until(dropped, 5, "stale wake-up tokens dropped")
        # Idle and blocked now: one more job is one more token, taken at once.
        job_id = await client.enqueue(Echo(text="last"))
        await wait_for_status(agent, job_id, JobStatus.SUCCESS, timeout_s=STARTED_WITHIN_S * 5)


async def test_without_push_the_worker_polls(settings: AgentSettings, redis: Redis, job_registry: object) -> None:
    """The switch works: with push off, the fast worker polls every poll_delay again (the other
    tests here would fail like this without the feature)."""
    polling = dataclasses.replace(settings, worker_push_wakeup=False)
    async with Agent(polling) as agent, running_worker(agent, poll_delay=POLL_DELAY_S):
        await asyncio.sleep(0.3)
        waits_s = []
        for _ in range(3):
            job_id = await ClientAgent(agent).enqueue(Echo(text="hi"))
            state = await wait_for_status(agent, job_id, JobStatus.SUCCESS, poll_s=0.005)
            assert state.started_ms is not None
            waits_s.append((state.started_ms - state.created_ms) / 1000)
    assert max(waits_s) > STARTED_WITHIN_S, waits_s


async def test_deferred_job_starts_on_time_while_idle_blocked(agent: Agent, client: ClientAgent) -> None:
    async with running_worker(agent, poll_delay=POLL_DELAY_S):
        await asyncio.sleep(0.3)
        job_id = await client.enqueue(Echo(text="later"), defer_s=0.7)
        state = await wait_for_status(agent, job_id, JobStatus.SUCCESS, timeout_s=5, poll_s=0.005)
    assert state.started_ms is not None
    late_s = (state.started_ms - state.created_ms) / 1000 - 0.7
    assert -0.01 <= late_s < 0.25, f"started {late_s:.3f}s after its time"


async def test_a_retry_with_backoff_starts_on_time(settings: AgentSettings, redis: Redis, job_registry: object) -> None:
    """arq re-queues a retry itself, in the future, while the worker that ran it is idle-blocked:
    the finish wakes a worker, which then waits for the retry's time only."""
    retrying = dataclasses.replace(settings, retry_backoff_base_s=0.4, retry_backoff_max_s=0.4)
    async with Agent(retrying) as agent, running_worker(agent, poll_delay=POLL_DELAY_S):
        await asyncio.sleep(0.3)
        job_id = await ClientAgent(agent).enqueue(Flaky(fail_times=1))
        started = time.monotonic()
        state = await wait_for_status(agent, job_id, JobStatus.SUCCESS, timeout_s=10, poll_s=0.005)
        took_s = time.monotonic() - started
    assert state.attempts == 2
    assert took_s < 2.0, f"the retry (backoff at most 0.4 s) took {took_s:.2f}s"


@pytest.mark.slow
async def test_a_cron_tick_still_fires_while_idle_blocked(
    settings: AgentSettings, redis: Redis, tmp_path: Path
) -> None:
    """arq enqueues a cron tick from its heartbeat, about a second early: an idle worker wakes for
    it, then for the tick's own time. (Up to a minute: the next real minute boundary.)"""
    url = f"sqlite+aiosqlite:///{tmp_path}/schedules.db"
    await upgrade_async(url)
    async with Agent(settings, overrides=ScheduleOverrides(url, namespace=settings.namespace)) as agent:
        client = ClientAgent(agent)
        async with running_worker(agent, poll_delay=POLL_DELAY_S):

            async def ticked() -> bool:
                return any(s.status is JobStatus.SUCCESS for s in await client.list_by_schedule(Ticking.name))

            await until(ticked, 75, "a tick of the every-minute schedule")
        [run] = await client.list_by_schedule(Ticking.name)
    assert run.started_ms is not None
    into_minute_s = (run.started_ms % 60_000) / 1000
    assert into_minute_s < 1.0, f"the tick started {into_minute_s:.3f}s after its minute"


# -- worker processes on a private Redis: commands while idle, SIGTERM, a Redis restart ---------

def start_worker(namespace: str, redis_url: str, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    env = fault_env(
        namespace, redis_url,
        # The library's defaults for the background sweeps, so that the figure is the idle cost.
        AGENT_LEASE_SECONDS="30", AGENT_RECONCILE_INTERVAL_SECONDS="5", AGENT_POLL_DELAY_SECONDS="0.005", **extra,
    )
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agent_async", "worker", "--jobs", "tests.faults.svc"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )


async def total_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


async def idle_commands_per_s(redis: Redis, window_s: float = 2.0) -> float:
    before = await total_calls(redis)
    await asyncio.sleep(window_s)
    return (await total_calls(redis) - before) / window_s


async def wait_until_serving(client: ClientAgent, agent: Agent) -> None:
    """A job round trip: the worker has started and is past its start-up."""
    job_id = await client.enqueue(Sleep(duration_s=0.0))
    await wait_for_status(agent, job_id, JobStatus.SUCCESS, timeout_s=30)


@pytest.mark.slow
@pytest.mark.parametrize("push", [True, False], ids=["push", "polling"])
async def test_an_idle_worker_issues_few_redis_commands(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path, push: bool
) -> None:
    proc = start_worker(namespace, private_redis.url, tmp_path / "worker.log",
                        AGENT_WORKER_PUSH_WAKEUP=str(push).lower())
    try:
        async with Agent(AgentSettings(redis_url=private_redis.url, namespace=namespace)) as agent:
            await wait_until_serving(ClientAgent(agent), agent)
            await asyncio.sleep(0.5)
            rate = await idle_commands_per_s(agent.job_store.redis)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    if push:
        assert rate < 20, f"{rate:.1f} commands/s while idle"
    else:
        assert rate > 50, f"polling every 5 ms issues far more: {rate:.1f}/s"


@pytest.mark.slow
async def test_sigterm_while_blocked_exits_promptly(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(namespace, private_redis.url, log)
    async with Agent(AgentSettings(redis_url=private_redis.url, namespace=namespace)) as agent:
        await wait_until_serving(ClientAgent(agent), agent)
    await asyncio.sleep(0.5)  # idle, blocked in Redis, the job run before it ended
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=15)
    took_s = time.monotonic() - started
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text, text
    # Far below the drain time (2 s): nothing runs, so nothing is waited for.
    assert took_s < 1.5, f"exited {took_s:.2f}s after SIGTERM"


@pytest.mark.slow
async def test_redis_restart_while_blocked_recovers(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(namespace, private_redis.url, log)
    try:
        async with Agent(AgentSettings(redis_url=private_redis.url, namespace=namespace)) as agent:
            client = ClientAgent(agent)
            await wait_until_serving(client, agent)
            await asyncio.sleep(0.5)  # idle, blocked in Redis
            private_redis.stop()
            await asyncio.sleep(1.5)
            private_redis.start()

            async def queued() -> str | None:
                try:
                    return await client.enqueue(Sleep(duration_s=0.0))
                except Exception:  # Redis still loading
                    return None

            job_id = None
            deadline = time.monotonic() + 20
            while job_id is None and time.monotonic() < deadline:
                job_id = await queued()
                await asyncio.sleep(0.1)
            assert job_id is not None, "Redis back"
            await wait_for_status(agent, job_id, JobStatus.SUCCESS, timeout_s=30)
            assert proc.poll() is None, log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=15)


# -- the claim sent behind the blocking pop -----------------------------------------------------

def behind_the_pop(agent: Agent, wanted: int = 5) -> ScriptCall:
    names = agent.engine.names
    return claim_call(names.queue, names.wake_key, wanted=wanted, ttl_ms=60_000, read_limit=100, at=SERVER_NOW)


async def test_the_claim_behind_the_pop_takes_the_job_that_woke_it(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """The claim is written with the BLPOP and runs as soon as the token arrives, on Redis's clock:
    it takes the job queued during the wait (marked in progress) and its reply comes with the wake-up."""
    call = behind_the_pop(agent)
    await load_scripts(redis, [call.script])
    waker = Waker(redis, agent.engine.names.wake_key)
    try:
        waiting = asyncio.create_task(waker.wait(10, on_time=False, then=call))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        job_id = await client.enqueue(Echo(text="wake"))
        woken = await asyncio.wait_for(waiting, 5)
    finally:
        await waker.close()
    assert woken.token
    claimed = parse_claim(woken.then)
    engine_id = agent.engine.names.engine_job_id(job_id)
    assert [job for job, _ in claimed.jobs] == [engine_id]
    assert await redis.exists(in_progress_key_prefix + engine_id) == 1
    # Claimed once: a second claim finds it in progress.
    assert parse_claim(await run_script(redis, behind_the_pop(agent))).jobs == []


async def test_a_failed_claim_behind_the_pop_leaves_the_connection_in_step(
    private_redis: PrivateRedis, namespace: str
) -> None:
    """Redis lost the script (a restart, SCRIPT FLUSH): the wake-up still counts, the claim's reply
    is None (the worker claims the usual way), and the next wait on that connection works."""
    redis = Redis.from_url(private_redis.url)
    async with Agent(AgentSettings(redis_url=private_redis.url, namespace=namespace)) as agent:
        await redis.script_flush()
        waker = Waker(redis, agent.engine.names.wake_key)
        try:
            await redis.lpush(agent.engine.names.wake_key, "1")
            first = await waker.wait(5, on_time=False, then=behind_the_pop(agent))
            await redis.lpush(agent.engine.names.wake_key, "1")
            second = await waker.wait(5, on_time=False)
        finally:
            await waker.close()
            await redis.aclose()
    assert (first.token, first.then) == (True, None)
    assert (second.token, second.then) == (True, None)
