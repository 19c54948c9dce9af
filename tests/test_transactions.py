"""arq's per-job transactions as the fast worker sends them (engine/transactions.py, pickup.lua):
the claim picks each job up and starts it, so arq's pickup costs no round trip; the finishes of jobs
that end together go out as one MULTI/EXEC (group commit), each job's replies and errors its own,
a failed send every member's; nothing is lost or left waiting, and a job claimed right before a stop
is handed back."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import signal
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from arq.connections import ArqRedis
from arq.constants import abort_jobs_ss
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, ConfigurationError, JobStatus
from agent_async.engine.claim import (
    CLAIM_WITH_PICKUP,
    SERVER_NOW,
    Claimed,
    Pickup,
    claim_call,
    claim_in_finish,
    parse_claim,
)
from agent_async.engine.finish import FINISH_BATCH, Finisher, FinishError, RunEnd
from agent_async.engine.wakeup import Waker
from agent_async.engine.worker import FastWorker
from agent_async.lifecycle import now_ms
from agent_async.registry import JobRegistry
from agent_async.store import run_script
from tests.conftest import run_burst
from tests.faults.conftest import PrivateRedis
from tests.faults.svc.jobs.sleep import Sleep
from tests.jobs import Echo, Flaky, runs_key


@pytest.fixture
async def pool(private_redis: PrivateRedis) -> AsyncIterator[ArqRedis]:
    client = ArqRedis.from_url(private_redis.url)
    yield client
    await client.aclose()


async def exec_calls(redis: Redis) -> int:
    stats: dict[str, Any] = await redis.info("commandstats")
    return int(stats.get("cmdstat_exec", {}).get("calls", 0))


def finisher_for(agent: Agent, redis: Redis, *, aborts: str = "", batch: bool = True) -> Finisher:
    script, store_args = agent.job_store.ending_in(FINISH_BATCH)
    names = agent.engine.names
    return Finisher(
        lambda: redis, script, store_args, queue=names.queue, wake_key=names.wake_key, abort_set=aborts, batch=batch
    )


async def loaded(finisher: Finisher, redis: Redis) -> Finisher:
    """The finisher, its script known to Redis (a first call would count a NOSCRIPT and a retry)."""
    await redis.script_load(finisher.script.source)
    return finisher


async def claimed_runs(agent: Agent, client: ClientAgent, redis: Redis, n: int) -> list[str]:
    """n jobs queued, then claimed and started as the fast worker's claim does; their engine ids."""
    job_ids = [await client.enqueue(Echo(text=str(i))) for i in range(n)]
    names = agent.engine.names
    claimed = parse_claim(await run_script(redis, claim_call(
        names.queue, names.wake_key, wanted=n, ttl_ms=10_000, read_limit=100, pickup=pickup_for(agent),
    )))
    assert sorted(claimed.picked) == sorted(names.engine_job_id(j) for j in job_ids)
    return [names.engine_job_id(j) for j in job_ids]


def success(agent: Agent, engine_id: str, i: int) -> RunEnd:
    job_id = agent.engine.names.job_id(engine_id)
    assert job_id is not None
    return RunEnd(engine_id, agent.job_store.transition_of(job_id, JobStatus.SUCCESS, result={"i": i}), done=True)


async def calls(redis: Redis, command: str) -> int:
    stats: dict[str, Any] = await redis.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_runs_that_end_together_are_finished_in_one_call_each_with_its_outcome_and_arqs_finish(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    engine_ids = await claimed_runs(agent, client, redis, 5)
    finisher = await loaded(finisher_for(agent, redis), redis)
    before = await calls(redis, "evalsha")
    await asyncio.gather(*(finisher.finish(success(agent, e, i)) for i, e in enumerate(engine_ids)))
    assert await calls(redis, "evalsha") - before == 1
    assert (finisher.stats.items, finisher.stats.sends, finisher.stats.largest) == (5, 1, 5)
    for i, engine_id in enumerate(engine_ids):
        state = await agent.job_store.get(agent.engine.names.job_id(engine_id) or "")
        assert state is not None and (state.status, state.result) == (JobStatus.SUCCESS, {"i": i})
        # arq's finish of a job done: its claim, tries and record deleted, out of the queue.
        for prefix in ("arq:in-progress:", "arq:retry:", "arq:job:"):
            assert await redis.exists(prefix + engine_id) == 0
    assert await redis.zcard(agent.engine.names.queue) == 0
    assert await redis.zcard(agent.keys.active_index) == 0 and await redis.zcard(agent.keys.leases) == 0


class Claims:
    """A FinishClaims that asks for a fixed number of jobs with every finish, and keeps the replies."""

    def __init__(self, agent: Agent, wanted: int) -> None:
        pickup = pickup_for(agent)
        without_aborts = Pickup(pickup.script, (*pickup.args[:-1], ""))
        _, self.args = claim_in_finish(wanted, ttl_ms=10_000, read_limit=100, pickup=without_aborts)
        self.wanted = wanted
        self.replies: list[tuple[Claimed, list[str]]] = []
        self.unanswered_args: list[tuple[str | int, ...]] = []

    def claim_for(self, runs: Sequence[str]) -> tuple[int, tuple[str | int, ...]]:
        return self.wanted, self.args

    def unanswered(self, claim_args: tuple[str | int, ...]) -> None:
        self.unanswered_args.append(claim_args)

    def claimed(self, reply: Any, runs: Sequence[str]) -> None:
        self.replies.append((parse_claim(reply), list(runs)))


async def test_a_finish_claims_due_jobs_for_the_slots_its_runs_free(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """The finish of two runs claims (and picks up, and starts) two of the jobs due, in the same
    call: the worker runs them in those runs' slots without a claim call of its own. The ends and
    the starts share one batch: their counters are read and written once."""
    engine_ids = await claimed_runs(agent, client, redis, 2)
    waiting = [agent.engine.names.engine_job_id(await client.enqueue(Echo(text=str(i)))) for i in range(3)]
    claims = Claims(agent, wanted=2)
    script, store_args = agent.job_store.ending_in(FINISH_BATCH)
    names = agent.engine.names
    finisher = Finisher(lambda: redis, script, store_args, queue=names.queue, wake_key=names.wake_key, claims=claims)
    await loaded(finisher, redis)
    before = await calls(redis, "evalsha")
    hmgets, hsets = await calls(redis, "hmget"), await calls(redis, "hset")
    await asyncio.gather(*(finisher.finish(success(agent, e, i)) for i, e in enumerate(engine_ids)))
    assert await calls(redis, "evalsha") - before == 1
    # One HMGET and one HSET per state moved (two ends, two starts), and one each for the counters.
    assert (await calls(redis, "hmget") - hmgets, await calls(redis, "hset") - hsets) == (5, 5)
    [(claimed, runs)] = claims.replies
    assert runs == engine_ids
    taken = [job for job, _ in claimed.jobs]
    assert len(taken) == 2 and set(taken) < set(waiting) and sorted(claimed.picked) == sorted(taken)
    assert claimed.next_ms == -1  # one more is due: the batch is full
    for engine_id in waiting:
        state = await agent.job_store.get(names.job_id(engine_id) or "")
        expected = JobStatus.STARTED if engine_id in taken else JobStatus.PENDING
        assert state is not None and state.status is expected
    for engine_id in engine_ids:
        state = await agent.job_store.get(names.job_id(engine_id) or "")
        assert state is not None and state.status is JobStatus.SUCCESS


async def test_a_batchs_counters_are_added_in_one_read_and_one_write(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """The counters the finishes of a batch move (ends by job name and status, the run-time buckets
    and sum) are read in one call and written in one, each added to what it held: not one HINCRBY
    per field (the only one left is the hour's count of ends, whose new value the script reads)."""
    engine_ids = await claimed_runs(agent, client, redis, 4)
    state = await agent.job_store.get(agent.engine.names.job_id(engine_ids[0]) or "")
    assert state is not None
    ended, durations = f"fin|{state.name}|SUCCESS", f"dur_b|{state.name}|"
    await redis.hset(agent.keys.metrics, ended, 7)
    finisher = await loaded(finisher_for(agent, redis), redis)
    before = {command: await calls(redis, command) for command in ("hincrby", "hmget", "hset")}
    await asyncio.gather(*(finisher.finish(success(agent, e, i)) for i, e in enumerate(engine_ids)))
    # One HMGET per run (its state) and one for the counters; one HSET per run and one for them.
    assert {command: await calls(redis, command) - n for command, n in before.items()} == {
        "hincrby": 1, "hmget": 5, "hset": 5,
    }
    counters = {k.decode(): int(v) for k, v in (await redis.hgetall(agent.keys.metrics)).items()}
    assert counters[ended] == 7 + 4
    assert sum(n for field, n in counters.items() if field.startswith(durations)) == 4


async def test_a_finish_that_wants_no_jobs_claims_none(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    [engine_id] = await claimed_runs(agent, client, redis, 1)
    waiting = await client.enqueue(Echo(text="w"))
    claims = Claims(agent, wanted=0)
    script, store_args = agent.job_store.ending_in(FINISH_BATCH)
    names = agent.engine.names
    finisher = Finisher(lambda: redis, script, store_args, queue=names.queue, wake_key=names.wake_key, claims=claims)
    await finisher.finish(success(agent, engine_id, 0))
    assert claims.replies == []
    state = await agent.job_store.get(waiting)
    assert state is not None and state.status is JobStatus.PENDING


async def test_a_finish_that_finds_nothing_due_leaves_the_wake_tokens_for_idle_workers(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """A job queued for later drops a wake-up token, so an idle worker wakes and waits for its time.
    A busy worker's finish that finds nothing due to claim must not take that token as stale (the
    idle worker's own claim would, knowing it waits for the job itself): the token stays."""
    [engine_id] = await claimed_runs(agent, client, redis, 1)
    names = agent.engine.names
    await redis.delete(names.wake_key)
    await client.enqueue(Echo(text="later"), defer_s=30)
    assert await redis.llen(names.wake_key) == 1
    claims = Claims(agent, wanted=1)
    script, store_args = agent.job_store.ending_in(FINISH_BATCH)
    finisher = Finisher(lambda: redis, script, store_args, queue=names.queue, wake_key=names.wake_key, claims=claims)
    await finisher.finish(success(agent, engine_id, 0))
    [(claimed, _)] = claims.replies
    assert claimed.jobs == []
    assert await redis.llen(names.wake_key) == 1


async def test_a_busy_worker_claims_with_its_finishes_and_runs_each_job_once(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """60 jobs, 10 slots: after the first claim, the jobs are claimed by the finishes of the runs
    before them (the worker says how many); each runs once. Its loop seldom wakes while slots pass
    from run to run: the tasks of ended runs leave arq's task table as they end, not at its turns."""
    settings = AgentSettings(
        redis_url=private_redis.url, namespace=namespace, database_url=f"sqlite+aiosqlite:///{tmp_path}/a.db",
    )
    caplog.set_level(logging.INFO, logger="agent_async.engine.finish")  # the group commit's line
    real_claimed = FastWorker.claimed
    table_sizes: list[int] = []

    def claimed_seeing_the_table(self: FastWorker, reply: Any, runs: Sequence[str]) -> None:
        table_sizes.append(len(self.tasks))
        real_claimed(self, reply, runs)

    monkeypatch.setattr(FastWorker, "claimed", claimed_seeing_the_table)
    async with Agent(settings) as agent:
        client = ClientAgent(agent)
        job_ids = [await client.enqueue(Echo(text=str(i))) for i in range(60)]
        await run_burst(agent)
        states = await agent.job_store.get_many(job_ids)
        runs = await agent.job_store.redis.hgetall(runs_key(namespace))
    assert [s.status if s else None for s in states] == [JobStatus.SUCCESS] * 60
    assert all(s is not None and s.attempts == 1 for s in states)
    assert [int(runs.get(job_id.encode(), 0)) for job_id in job_ids] == [1] * 60
    [record] = [r for r in caplog.records if r.msg.startswith("group commit")]
    claimed_with_finishes = record.args[4]
    assert claimed_with_finishes >= 30, record.getMessage()
    assert table_sizes and max(table_sizes) <= 2 * settings.worker_max_jobs, table_sizes


async def test_jobs_claimed_by_a_finish_as_the_worker_stops_are_handed_back(
    agent: Agent, client: ClientAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop lands between a finish's claim and the slots its jobs wait for: they go back to
    PENDING (attempts as they were, claim released) instead of waiting STARTED for their lease to
    run out, and the next worker runs them."""
    job_ids = [await client.enqueue(Echo(text=str(i))) for i in range(6)]
    real_claimed = FastWorker.claimed
    handed: list[str] = []

    def claimed_then_stop(self: FastWorker, reply: Any, runs: Sequence[str]) -> None:
        jobs = [job for job, _ in parse_claim(reply).jobs]
        if jobs and not handed:
            handed.extend(jobs)
            self.handle_sig(signal.SIGTERM)
        real_claimed(self, reply, runs)

    monkeypatch.setattr(FastWorker, "claimed", claimed_then_stop)
    await agent.run_worker(burst=True, handle_signals=False, poll_delay=0, max_jobs=3)
    monkeypatch.undo()
    assert handed
    states = {s.job_id: s for s in await agent.job_store.get_many(job_ids) if s is not None}
    for engine_id in handed:
        state = states[agent.engine.names.job_id(engine_id) or ""]
        assert (state.status, state.attempts) == (JobStatus.PENDING, 0)
    assert {s.status for s in states.values()} <= {JobStatus.SUCCESS, JobStatus.PENDING}
    await run_burst(agent)
    states_after = await agent.job_store.get_many(job_ids)
    assert [(s.status, s.attempts) if s else None for s in states_after] == [(JobStatus.SUCCESS, 1)] * 6


async def test_a_retry_is_queued_again_later_and_wakes_an_idle_worker(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    [engine_id] = await claimed_runs(agent, client, redis, 1)
    names = agent.engine.names
    job_id = names.job_id(engine_id) or ""
    score = await redis.zscore(names.queue, engine_id)
    await redis.delete(names.wake_key)
    retry = agent.job_store.transition_of(job_id, JobStatus.RETRY, error="ValueError: later")
    await finisher_for(agent, redis).finish(RunEnd(engine_id, retry, done=False, requeue_ms=5_000))
    state = await agent.job_store.get(job_id)
    assert state is not None and (state.status, state.error) == (JobStatus.RETRY, "ValueError: later")
    assert await redis.zscore(names.queue, engine_id) == (score or 0) + 5_000
    assert await redis.exists(f"arq:in-progress:{engine_id}") == 0  # claimable again, when due
    assert await redis.exists(f"arq:job:{engine_id}") == 1
    assert await redis.llen(names.wake_key) == 1
    assert await redis.zscore(agent.keys.leases, job_id) is None
    assert await redis.zscore(agent.keys.active_index, job_id) is not None


async def test_a_retrys_finish_sent_again_after_its_reply_was_lost_leaves_the_next_attempt_alone(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """The finish of a retry ran, its reply was lost, and it is sent again (the worker holds the
    outcome until Redis answers) after the retry was claimed and its next attempt started. The
    second send is a no-op: the next attempt stays STARTED with its lease, its claim and its place
    in the queue (before, it was moved back to RETRY, its claim dropped and its score pushed again:
    a second worker could run it at the same time). A resend that finds the retry still queued
    changes nothing either."""
    [engine_id] = await claimed_runs(agent, client, redis, 1)
    names = agent.engine.names
    job_id = names.job_id(engine_id) or ""
    finisher = finisher_for(agent, redis)
    retry = agent.job_store.transition_of(job_id, JobStatus.RETRY, error="ValueError: later", attempt=1)
    end = RunEnd(engine_id, retry, done=False, requeue_ms=5_000)
    await finisher.finish(end)
    queued_score = await redis.zscore(names.queue, engine_id)
    await finisher.finish(end)  # still queued for its retry: nothing moves
    state = await agent.job_store.get(job_id)
    assert state is not None and (state.status, state.attempts) == (JobStatus.RETRY, 1)
    assert await redis.zscore(names.queue, engine_id) == queued_score
    # The retry is claimed and started (attempt 2), as a worker's claim does it.
    await redis.set(f"arq:in-progress:{engine_id}", "next-claim", px=10_000)
    assert (await agent.job_store.start(job_id)).attempts == 2
    await finisher.finish(end)
    state = await agent.job_store.get(job_id)
    assert state is not None and (state.status, state.attempts) == (JobStatus.STARTED, 2)
    assert await redis.get(f"arq:in-progress:{engine_id}") == b"next-claim"
    assert await redis.zscore(names.queue, engine_id) == queued_score
    assert await redis.zscore(agent.keys.leases, job_id) is not None


async def test_a_transition_for_an_attempt_that_is_over_is_refused_as_stale(
    agent: Agent, client: ClientAgent
) -> None:
    """The stock Worker's outcome write, sent again: a move that is not an end (a retry, a
    hand-back) for attempt 1 does not touch attempt 2's run; an end is still written once."""
    store = agent.job_store
    job_id = await client.enqueue(Echo(text="x"))
    await store.start(job_id)
    await store.run(store.call_for(store.transition_of(job_id, JobStatus.RETRY, error="E: x", attempt=1)))
    await store.start(job_id)
    stale = store.call_for(store.transition_of(job_id, JobStatus.RETRY, error="E: x", attempt=1))
    assert await store.run(stale) == -1
    state = await store.get(job_id)
    assert state is not None and (state.status, state.attempts) == (JobStatus.STARTED, 2)
    assert await store.run(store.call_for(store.transition_of(job_id, JobStatus.SUCCESS, attempt=2))) == 1
    state = await store.get(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS


async def test_a_run_left_queued_keeps_its_place_and_only_its_claim_goes(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """A stop cancelled the run (no outcome, arq runs it again): the claim is dropped, nothing else."""
    [engine_id] = await claimed_runs(agent, client, redis, 1)
    names = agent.engine.names
    score = await redis.zscore(names.queue, engine_id)
    await finisher_for(agent, redis).finish(RunEnd(engine_id, None, done=False))
    assert await redis.zscore(names.queue, engine_id) == score
    assert await redis.exists(f"arq:in-progress:{engine_id}") == 0
    assert await redis.exists(f"arq:job:{engine_id}") == 1


async def test_one_runs_failed_transition_is_its_own_and_the_others_are_written(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """A state Redis cannot move (a key of the wrong type) fails that run alone, as an EVALSHA in a
    MULTI/EXEC did; arq's part of it is done all the same, and the reconciler settles its state."""
    engine_ids = await claimed_runs(agent, client, redis, 3)
    broken = agent.engine.names.job_id(engine_ids[1]) or ""
    await redis.delete(agent.keys.state(broken))
    await redis.set(agent.keys.state(broken), "not a hash")
    finisher = finisher_for(agent, redis)
    results = await asyncio.gather(
        *(finisher.finish(success(agent, e, i)) for i, e in enumerate(engine_ids)), return_exceptions=True
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], FinishError) and "WRONGTYPE" in str(results[1])
    for i in (0, 2):
        state = await agent.job_store.get(agent.engine.names.job_id(engine_ids[i]) or "")
        assert state is not None and state.status is JobStatus.SUCCESS
    assert await redis.exists(f"arq:job:{engine_ids[1]}", f"arq:in-progress:{engine_ids[1]}") == 0
    assert finisher.stats.sends == 1


async def test_with_aborts_off_the_abort_set_is_not_touched(
    agent: Agent, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    """arq's finish ZREMs the job from its abort set even with aborts off (nothing reads the set
    then): the finish leaves it alone, and takes the job out of it with aborts on."""
    abort_key = f"{namespace}:abort-set"  # this test's own: arq's is shared by every namespace
    first, second = await claimed_runs(agent, client, redis, 2)
    await redis.zadd(abort_key, {first: 1, second: 1})
    before = await calls(redis, "zrem")
    await finisher_for(agent, redis).finish(success(agent, first, 0))
    assert await redis.zscore(abort_key, first) == 1
    await finisher_for(agent, redis, aborts=abort_key).finish(success(agent, second, 1))
    assert await redis.zscore(abort_key, second) is None
    # Off: the queue's ZREM only (the active index and the leases are ZREMs too, in both).
    assert await calls(redis, "zrem") - before == 2 * 3 + 1


async def test_the_fast_worker_with_aborts_off_leaves_the_abort_set_alone(agent: Agent, client: ClientAgent) -> None:
    """The worker's finishes leave arq's abort set alone with aborts off (the library never turns
    arq's aborts on): an entry someone put in it outlives the job's finish."""
    job_id = await client.enqueue(Echo(text="x"))
    engine_id = agent.engine.names.engine_job_id(job_id)
    redis = agent.job_store.redis
    await redis.zadd(abort_jobs_ss, {engine_id: 1})
    try:
        await run_burst(agent)
        state = await agent.job_store.get(job_id)
        assert state is not None and state.status is JobStatus.SUCCESS
        assert await redis.zscore(abort_jobs_ss, engine_id) == 1
    finally:
        await redis.zrem(abort_jobs_ss, engine_id)


async def test_without_batching_each_run_goes_alone(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    engine_ids = await claimed_runs(agent, client, redis, 3)
    finisher = finisher_for(agent, redis, batch=False)
    await asyncio.gather(*(finisher.finish(success(agent, e, i)) for i, e in enumerate(engine_ids)))
    assert (finisher.stats.sends, finisher.stats.largest) == (3, 1)


async def test_the_finish_script_is_loaded_again_when_redis_lost_it(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    [engine_id] = await claimed_runs(agent, client, redis, 1)
    await redis.script_flush()
    await finisher_for(agent, redis).finish(success(agent, engine_id, 0))
    state = await agent.job_store.get(agent.engine.names.job_id(engine_id) or "")
    assert state is not None and state.status is JobStatus.SUCCESS


def private_settings(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, **overrides: Any
) -> AgentSettings:
    """Settings on the test's own redis-server, with the worker's INFO lines (its group commit
    figures at stop) captured."""
    caplog.set_level(logging.INFO, logger="agent_async.engine.finish")  # the group commit's line
    return AgentSettings(
        redis_url=private_redis.url, namespace=namespace, database_url=f"sqlite+aiosqlite:///{tmp_path}/a.db",
        **overrides,
    )


@pytest.mark.parametrize("coalesce", [True, False])
async def test_a_backlog_drains_with_fewer_finish_calls_than_jobs_and_every_outcome_kept(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path, coalesce: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """30 jobs through the fast worker (10 slots): no MULTI/EXEC for any of them (the claim picked
    each job up, the finish script ends each run with arq's part), one finish call per run without
    group commit, fewer with it (the worker says so when it stops); the same outcomes either way."""
    async with Agent(private_settings(private_redis, namespace, tmp_path, caplog, worker_coalesce=coalesce)) as agent:
        client = ClientAgent(agent)
        job_ids = [await client.enqueue(Echo(text=str(i))) for i in range(30)]
        redis = agent.job_store.redis
        execs = await exec_calls(redis)
        await run_burst(agent)
        execs = await exec_calls(redis) - execs
        states = [await agent.job_store.get(job_id) for job_id in job_ids]
    assert [s.status if s else None for s in states] == [JobStatus.SUCCESS] * 30
    assert [s.result for s in states if s] == [{"echo": str(i), "sum": 0, "user": None} for i in range(30)]
    assert execs < 5, "none per job (the worker directory's entry is written and removed in its own)"
    [(finishes, calls, largest)] = [r.args[:3] for r in caplog.records if r.msg.startswith("group commit")]
    # (a run of a test schedule's cron can join them when the drain crosses its minute)
    assert finishes >= 30
    if coalesce:
        assert calls < finishes and largest > 1, (finishes, calls, largest)
    else:
        assert (calls, largest) == (finishes, 1)


@pytest.mark.parametrize("linger_ms", [0.0, 100.0])
async def test_a_finish_linger_gathers_runs_that_end_apart_into_one_call(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path, linger_ms: float, caplog: pytest.LogCaptureFixture
) -> None:
    """Ten runs in ten slots, ending 5 ms apart. Without a linger each finish goes as it comes (a
    call takes less than 5 ms here); with AGENT_WORKER_FINISH_LINGER_MS they wait for each other
    while runs still hold slots, and go as one call once the last has ended, well before the
    bound. The outcomes are the same."""
    settings = private_settings(private_redis, namespace, tmp_path, caplog, worker_finish_linger_ms=linger_ms)
    async with Agent(settings) as agent:
        client = ClientAgent(agent)
        job_ids = [await client.enqueue(Sleep(duration_s=0.005 * i)) for i in range(10)]
        await run_burst(agent)
        states = [await agent.job_store.get(job_id) for job_id in job_ids]
    assert [s.status if s else None for s in states] == [JobStatus.SUCCESS] * 10
    assert [s.result for s in states if s] == [{"slept_s": 0.005 * i} for i in range(10)]
    [(finishes, calls, largest)] = [r.args[:3] for r in caplog.records if r.msg.startswith("group commit")]
    if linger_ms:
        assert (finishes, calls, largest) == (10, 1, 10)
        ended = [s.finished_ms for s in states if s]
        assert len(set(ended)) == 1  # one call, one time for all
    else:
        assert finishes == 10 and calls >= 5, (finishes, calls, largest)


async def test_a_run_alone_in_its_worker_does_not_linger(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The linger (on by default) waits only for runs that still hold slots: a job that runs alone
    has its outcome written at once, even with a bound of 100 ms."""
    settings = private_settings(private_redis, namespace, tmp_path, caplog, worker_finish_linger_ms=100.0)
    async with Agent(settings) as agent:
        job_id = await ClientAgent(agent).enqueue(Sleep(duration_s=0.0))
        await run_burst(agent)
        state = await agent.job_store.get(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS
    [(finishes, calls, _, longest_wait_ms)] = [r.args[:4] for r in caplog.records if r.msg.startswith("group commit")]
    assert (finishes, calls) == (1, 1)
    assert longest_wait_ms < 50, longest_wait_ms  # a wait for the bound would be 100 ms


async def test_group_commit_is_a_setting(settings: AgentSettings) -> None:
    assert settings.worker_coalesce is True
    off = AgentSettings.from_env({"AGENT_WORKER_COALESCE": "false"})
    assert off.worker_coalesce is False
    assert dataclasses.replace(settings, worker_coalesce=False).worker_coalesce is False
    assert settings.worker_finish_linger_ms == 2.0  # bigger finish calls by default (docs/performance.md)
    assert AgentSettings.from_env({"AGENT_WORKER_FINISH_LINGER_MS": "0"}).worker_finish_linger_ms == 0
    assert AgentSettings.from_env({"AGENT_WORKER_FINISH_LINGER_MS": "2.5"}).worker_finish_linger_ms == 2.5
    with pytest.raises(ConfigurationError, match="AGENT_WORKER_FINISH_LINGER_MS"):
        AgentSettings.from_env({"AGENT_WORKER_FINISH_LINGER_MS": "500"})


def pickup_for(agent: Agent) -> Pickup:
    script, store_args = agent.job_store.starting_in(CLAIM_WITH_PICKUP)
    return Pickup(script, (agent.engine.names.engine_job_id(""), *store_args, "arq:abort"))


async def test_the_claim_picks_up_and_starts_each_job_it_takes(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """What arq's pickup transaction would have done (its tries counted, the job read) and the START
    transition, inside the claim: the job is STARTED before any worker code runs it."""
    job_id = await client.enqueue(Echo(text="x"), user_uid="alice")
    names = agent.engine.names
    # A job of this namespace that is not a tracked job (a cron tick): left for arq to pick up.
    await redis.zadd(names.queue, {names.cron_function("nightly", 0) + ":1": 0})
    claimed = parse_claim(await run_script(redis, claim_call(
        names.queue, names.wake_key, wanted=5, ttl_ms=10_000, read_limit=100, pickup=pickup_for(agent),
    )))
    engine_id = names.engine_job_id(job_id)
    assert sorted(job for job, _ in claimed.jobs) == sorted([engine_id, names.cron_function("nightly", 0) + ":1"])
    assert list(claimed.picked) == [engine_id]
    picked = claimed.picked[engine_id]
    assert picked.job == await redis.get(f"arq:job:{engine_id}")
    assert (picked.tries, picked.aborted) == (1, 0)
    assert agent.job_store.parse_start(picked.start).run is True
    state = await agent.job_store.get(job_id)
    assert state is not None and state.status is JobStatus.STARTED and state.attempts == 1
    # The try is the state's attempt: no arq tries key of its own (and none for the cron tick).
    assert await redis.get(f"arq:retry:{engine_id}") is None
    assert await redis.get(f"arq:retry:{names.cron_function('nightly', 0)}:1") is None


async def test_the_claim_reads_the_abort_set_once_and_takes_each_abort(
    agent: Agent, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    """A job aborted before its pickup is told so (and leaves arq's abort set), the others not; an
    empty abort set costs the claim one EXISTS, not one ZREM per job it takes."""
    names = agent.engine.names
    abort_key = f"{namespace}:abort-set"  # this test's own: arq's is shared by every namespace
    script, store_args = agent.job_store.starting_in(CLAIM_WITH_PICKUP)
    pickup = Pickup(script, (names.engine_job_id(""), *store_args, abort_key))

    async def claim(n: int) -> Claimed:
        return parse_claim(await run_script(redis, claim_call(
            names.queue, names.wake_key, wanted=n, ttl_ms=10_000, read_limit=100, pickup=pickup,
        )))

    ids = [names.engine_job_id(await client.enqueue(Echo(text=str(i)))) for i in range(3)]
    await redis.zadd(abort_key, {ids[1]: 1})
    claimed = await claim(3)
    assert [claimed.picked[i].aborted for i in ids] == [0, 1, 0]
    assert await redis.exists(abort_key) == 0
    ids = [names.engine_job_id(await client.enqueue(Echo(text=str(i)))) for i in range(5)]
    stats = await redis.info("commandstats")
    claimed = await claim(5)
    after = await redis.info("commandstats")
    assert [claimed.picked[i].aborted for i in ids] == [0] * 5

    def calls(info: dict[str, Any], command: str) -> int:
        return int(info.get(f"cmdstat_{command}", {}).get("calls", 0))

    assert calls(after, "zrem") - calls(stats, "zrem") == 0
    assert calls(after, "exists") - calls(stats, "exists") == 1


async def test_the_claims_tries_are_the_states_attempts_and_arqs_count_for_a_refused_start(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """A job the claim starts tries as often as its state was started (a retry: 2), with no arq
    tries key written; a job whose start is refused (it ended meanwhile) counts arq's own tries,
    with arq's expiry, as arq's pickup would."""
    job_id = await client.enqueue(Echo(text="x"))
    names = agent.engine.names
    engine_id = names.engine_job_id(job_id)
    tries_key = f"arq:retry:{engine_id}"

    async def claim() -> int:
        claimed = parse_claim(await run_script(redis, claim_call(
            names.queue, names.wake_key, wanted=1, ttl_ms=10_000, read_limit=100, pickup=pickup_for(agent),
        )))
        return claimed.picked[engine_id].tries

    assert await claim() == 1
    # Queued again as a retry (its claim released, its state RETRY): the second try.
    await redis.delete(f"arq:in-progress:{engine_id}")
    await redis.hset(agent.keys.state(job_id), "status", JobStatus.RETRY.value)
    assert await claim() == 2
    assert await redis.exists(tries_key) == 0
    state = await agent.job_store.get(job_id)
    assert state is not None and state.attempts == 2
    # Ended meanwhile (a terminal state): the start refuses it, arq's own count takes over.
    await redis.delete(f"arq:in-progress:{engine_id}")
    await redis.hset(agent.keys.state(job_id), "status", JobStatus.SUCCESS.value)
    assert await claim() == 1
    assert await redis.get(tries_key) == b"1"
    assert 88_000 < await redis.ttl(tries_key) <= 88_400
    await redis.delete(f"arq:in-progress:{engine_id}")
    assert await claim() == 2
    assert await redis.get(tries_key) == b"2"


async def test_a_start_that_fails_in_the_claim_fails_that_job_alone(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    broken, fine = await client.enqueue(Echo(text="a")), await client.enqueue(Echo(text="b"))
    await redis.delete(agent.keys.state(broken))
    await redis.set(agent.keys.state(broken), "not a hash")  # HMGET on it: WRONGTYPE
    names = agent.engine.names
    claimed = parse_claim(await run_script(redis, claim_call(
        names.queue, names.wake_key, wanted=5, ttl_ms=10_000, read_limit=100, pickup=pickup_for(agent),
    )))
    assert claimed.picked[names.engine_job_id(broken)].start is None  # the worker sends it itself
    assert agent.job_store.parse_start(claimed.picked[names.engine_job_id(fine)].start).run is True
    state = await agent.job_store.get(fine)
    assert state is not None and state.status is JobStatus.STARTED


async def test_a_job_claimed_right_before_a_stop_is_handed_back_not_lost(
    agent: Agent, client: ClientAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim started it, and the stop cancels its task before it began: it goes back to PENDING
    (attempts as they were) and is claimable again at once, instead of waiting for its lease to
    run out and being reported lost."""
    job_id = await client.enqueue(Echo(text="x"))
    claim_and_start = FastWorker._start

    async def claim_then_stop(self: FastWorker, claimed: Claimed) -> object:
        wait = await claim_and_start(self, claimed)
        if claimed.jobs:
            self.handle_sig(signal.SIGTERM)  # lands before any job task took a step
        return wait

    monkeypatch.setattr(FastWorker, "_start", claim_then_stop)
    await agent.run_worker(burst=True, handle_signals=False, poll_delay=0)
    state = await agent.job_store.get(job_id)
    assert state is not None and (state.status, state.attempts, state.started_ms) == (JobStatus.PENDING, 0, None)
    # The claim found nothing more and dropped the enqueue's token; the hand-back wakes a worker.
    assert await agent.job_store.redis.llen(agent.engine.names.wake_key) == 1  # type: ignore[misc]
    monkeypatch.undo()
    await run_burst(agent)
    state = await agent.job_store.get(job_id)
    assert state is not None and (state.status, state.attempts) == (JobStatus.SUCCESS, 1)
    assert state.result == {"echo": "x", "sum": 0, "user": None}


async def test_a_retry_claimed_again_before_the_run_that_queued_it_is_done_keeps_its_own_pickup(
    settings: AgentSettings, redis: Redis, job_registry: JobRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim of a retry can be read in the same turn of the loop as the finish of the run that
    queued it, before that run's task is done: the end of that task must not take the new run's
    pickup for a job it was itself handed and never ran. (It did: the new run was handed back and
    went down arq's own path, so the job was STARTED twice and failed as a lost worker's.)"""
    slow_retry = dataclasses.replace(settings, retry_backoff_base_s=5.0, retry_backoff_max_s=5.0)
    async with Agent(slow_retry) as agent:
        job_id = await ClientAgent(agent).enqueue(Flaky(fail_times=1))
        engine_id = agent.engine.names.engine_job_id(job_id)
        real_run_job = FastWorker.run_job
        claimed_again: list[list[str]] = []
        starts: list[asyncio.Task[Any]] = []

        async def run_then_claim_the_retry(self: FastWorker, run_id: str, score: int) -> None:
            await real_run_job(self, run_id, score)
            if run_id == engine_id and not claimed_again:
                # The retry is queued seconds ahead (its backoff): claimed as of then, from inside
                # the task of the run that queued it, as a claim read in the same turn would be.
                claim = self._claim_call(1, at=now_ms() + 60_000)
                claimed = parse_claim(await run_script(self.pool, claim))
                claimed_again.append([job for job, _ in claimed.jobs])
                # Started after this task is done and before its done-callbacks run.
                starts.append(asyncio.get_running_loop().create_task(self._start(claimed)))

        monkeypatch.setattr(FastWorker, "run_job", run_then_claim_the_retry)
        await agent.run_worker(burst=True, handle_signals=False, poll_delay=0)
        state = await agent.job_store.get(job_id)
        runs = await redis.hget(runs_key(settings.namespace), job_id)
        events = []
        async for event in ClientAgent(agent).events(job_id=job_id, idle_s=0.2):
            if event is None:
                break
            events.append(event)
    assert claimed_again == [[engine_id]]
    # No hand-back in between: the claim's start is the one that ran.
    assert [event.status for event in events] == [
        JobStatus.PENDING, JobStatus.STARTED, JobStatus.RETRY, JobStatus.STARTED, JobStatus.SUCCESS
    ]
    assert state is not None and (state.status, state.attempts, state.result) == (JobStatus.SUCCESS, 2, {"runs": 2})
    assert runs == b"2"


async def blocked_wait(agent: Agent, redis: Redis) -> tuple[Waker, asyncio.Task[Any], asyncio.Event]:
    """A wait with the claim behind its pop, whose first read is held until `release` is set (or
    the wait is cancelled): the replies stay unread in the socket, as when a stop lands between
    Redis running the claim and the worker reading it."""
    names = agent.engine.names
    waker = Waker(redis, names.wake_key)
    conn = await waker._connection()
    read = conn.read_response
    release = asyncio.Event()

    async def held_read(*args: Any, **kwargs: Any) -> Any:
        conn.read_response = read  # type: ignore[method-assign]  # only the first read is held
        await release.wait()
        return await read(*args, **kwargs)

    conn.read_response = held_read  # type: ignore[method-assign]
    pickup = pickup_for(agent)
    await redis.script_load(pickup.script.source)  # as the worker's first claim (run_script) does
    claim = claim_call(names.queue, names.wake_key, wanted=5, ttl_ms=10_000, read_limit=100, at=SERVER_NOW,
                       pickup=pickup)
    task = asyncio.create_task(waker.wait(10.0, on_time=False, then=claim))
    await asyncio.sleep(0.05)  # the pop and the claim behind it are in Redis, blocked
    return waker, task, release


async def test_a_wait_cancelled_after_its_claim_ran_keeps_the_claim_for_a_hand_back(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    waker, task, _ = await blocked_wait(agent, redis)
    job_id = await client.enqueue(Echo(text="x"))  # its token ends the pop; the claim runs at once
    for _ in range(100):
        state = await agent.job_store.get(job_id)
        if state is not None and state.status is JobStatus.STARTED:
            break
        await asyncio.sleep(0.01)
    assert state is not None and state.status is JobStatus.STARTED  # started by the claim, unread
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [list(parse_claim(reply).picked) for reply in waker.salvaged] == [[agent.engine.names.engine_job_id(job_id)]]
    await waker.close()


async def test_a_wait_cancelled_while_blocked_salvages_nothing_and_claims_nothing(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    waker, task, _ = await blocked_wait(agent, redis)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    job_id = await client.enqueue(Echo(text="x"))
    await asyncio.sleep(0.1)
    state = await agent.job_store.get(job_id)
    assert state is not None and state.status is JobStatus.PENDING  # the dropped pop took nothing
    assert waker.salvaged == []
    await waker.close()


async def test_a_worker_stopped_right_after_its_claim_ran_behind_the_pop_hands_the_job_back(
    agent: Agent, client: ClientAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole path: an idle fast worker blocked with its claim behind the pop; a job arrives
    and the stop lands before the worker reads the claim's reply. The job goes back to PENDING
    (not left STARTED for recovery to fail as a lost worker's) and runs on the next worker."""
    held = asyncio.Event()
    real_connection = Waker._connection

    async def holding_connection(self: Waker) -> Any:
        conn = await real_connection(self)
        read = conn.read_response

        async def held_read(*args: Any, **kwargs: Any) -> Any:
            conn.read_response = read  # type: ignore[method-assign]
            held.set()
            await asyncio.Event().wait()  # until the stop cancels it
            return await read(*args, **kwargs)

        conn.read_response = held_read  # type: ignore[method-assign]
        return conn

    monkeypatch.setattr(Waker, "_connection", holding_connection)
    worker = asyncio.create_task(agent.run_worker(handle_signals=False, poll_delay=0.005))
    await asyncio.wait_for(held.wait(), 10)
    job_id = await client.enqueue(Echo(text="x"))
    for _ in range(100):
        state = await agent.job_store.get(job_id)
        if state is not None and state.status is JobStatus.STARTED:
            break
        await asyncio.sleep(0.01)
    worker.cancel()
    await asyncio.gather(worker, return_exceptions=True)
    state = await agent.job_store.get(job_id)
    assert state is not None and (state.status, state.attempts) == (JobStatus.PENDING, 0)
    monkeypatch.undo()
    await run_burst(agent)
    state = await agent.job_store.get(job_id)
    assert state is not None and (state.status, state.attempts) == (JobStatus.SUCCESS, 1)


@pytest.mark.parametrize("freeze", [True, False])
async def test_a_worker_takes_what_start_up_left_out_of_the_collector_unless_told_not_to(
    settings: AgentSettings, freeze: bool
) -> None:
    """AGENT_WORKER_GC_FREEZE: a full collection would otherwise walk every object alive since
    start-up (a 50-60 ms stall of the loop every few thousand jobs, docs/performance.md)."""
    gc.unfreeze()
    async with Agent(dataclasses.replace(settings, worker_gc_freeze=freeze)) as agent:
        job_id = await ClientAgent(agent).enqueue(Echo(text="x"))
        await run_burst(agent)
        state = await agent.job_store.get(job_id)
    assert state is not None and state.status is JobStatus.SUCCESS
    assert (gc.get_freeze_count() > 0) is freeze
