"""Enqueues of concurrent callers in one script call (agent_async.store.enqueue, store/lua/enqueue.lua):
each job keeps its own checks and atomicity, a refused job refuses no other caller's, the writes
the jobs share go out once, and nothing is lost when Redis lost the script or is down."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from arq.jobs import deserialize_job
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, JobStatus
from agent_async.engine.wire import serialize, wire_loads
from agent_async.errors import DuplicateJobError, EnqueueError, QueueUnavailableError, RequestCode, RequestRefusedError
from agent_async.state import JobState, new_job_id
from tests.faults.conftest import PrivateRedis, free_port
from tests.jobs import Echo, GatedFive, Sleeper


async def command_calls(redis: Redis) -> dict[str, int]:
    stats: dict[str, Any] = await redis.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


async def test_concurrent_enqueues_go_out_together_and_each_keeps_its_gate(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """Sleeper allows 2 at a time per user: of 12 enqueues sent together, exactly 2 are queued, and
    each refusal is its own caller's."""
    await client.enqueue(Sleeper(), "other")  # loads the enqueue script (a NOSCRIPT, then SCRIPT LOAD)
    stats = agent.job_store.enqueues.stats
    sends_before = stats.sends
    outcomes = await asyncio.gather(*(client.enqueue(Sleeper(), "u") for _ in range(12)), return_exceptions=True)
    queued = [o for o in outcomes if isinstance(o, str)]
    refused = [o for o in outcomes if isinstance(o, RequestRefusedError)]
    assert len(queued) == 2 and len(refused) == 10, outcomes
    assert all(r.code is RequestCode.JOB_CONCURRENT_LIMIT for r in refused)
    assert (stats.sends - sends_before, stats.largest) == (1, 12)
    for job_id in queued:
        state = await client.get_state(job_id)
        assert state is not None and state.status is JobStatus.PENDING
    assert await agent.job_store.slots_held(agent.keys.gate(Sleeper.name, "u")) == 2
    # Nothing of the refused ones was written: only the three states exist.
    assert len([k async for k in redis.scan_iter(match=agent.keys.state("*"))]) == 3


async def test_a_job_redis_refuses_refuses_no_other_callers_job(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """Unlike enqueue_many's batch (one caller, who is told where it stopped), concurrent enqueues
    are different callers': a job refused for a key of the wrong type (its job type's index) is
    refused alone, with nothing of it written, and the others sent with it are queued."""
    await redis.set(agent.keys.name_index(GatedFive.name), "not a zset")
    outcomes = await asyncio.gather(
        client.enqueue(Echo(text="a"), "erin"), client.enqueue(GatedFive(), "erin"),
        client.enqueue(Echo(text="b"), "erin"), return_exceptions=True,
    )
    assert isinstance(outcomes[1], EnqueueError) and "wrong type" in str(outcomes[1])
    states = await agent.job_store.get_many([o for o in outcomes if isinstance(o, str)])
    assert [s.payload["text"] if s else None for s in states] == ["a", "b"]
    assert await client.count_for_user("erin") == 2
    assert await redis.zcard(agent.engine.names.queue) == 2
    assert await agent.job_store.slots_held(agent.keys.gate(GatedFive.name, "erin")) == 0


async def test_a_duplicate_id_is_refused_alone(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Echo(text="first"))
    state = await agent.job_store.get(job_id)
    assert state is not None

    async def again() -> None:
        await agent.job_store.create(state, gate=None, run=agent.engine.run_at())

    outcomes = await asyncio.gather(again(), client.enqueue(Echo(text="other")), return_exceptions=True)
    assert isinstance(outcomes[0], DuplicateJobError) and isinstance(outcomes[1], str)


async def test_an_id_the_caller_chose_is_checked_and_a_drawn_one_is_not(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """Only a chosen id (a schedule's fire) can exist already: its enqueue checks, a drawn one's does not."""
    await client.enqueue(Echo(text="loads the script"))
    before = await command_calls(redis)
    await agent.create_job(Echo(text="chosen"), job_id="report@1700000000000")
    await agent.create_job(Echo(text="drawn"))
    after = await command_calls(redis)
    assert after.get("exists", 0) - before.get("exists", 0) == 1
    with pytest.raises(DuplicateJobError):
        await agent.create_job(Echo(text="again"), job_id="report@1700000000000")


async def test_the_writes_jobs_share_go_out_once_per_call(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """20 jobs of one type and user in one call: each index gets its first entry alone (which
    checks its type) and the other 19 in one call; one enqueue count, one wake-up push; no check
    that an id exists (new_job_id drew each); their events in two stream entries."""
    await client.enqueue(Echo(text="loads the script"))
    before = await command_calls(redis)
    ids = await asyncio.gather(*(client.enqueue(Echo(text=str(i)), "fred") for i in range(20)))
    after = await command_calls(redis)
    assert len(set(ids)) == 20 and agent.job_store.enqueues.stats.largest == 20
    commands = ("zadd", "hset", "psetex", "hincrby", "lpush", "exists", "xadd")
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in commands}
    # queue, active, all-jobs, job type and user indexes: 5 first writes, then 5 variadic ones; the
    # 20 PENDING events in two stream entries of 10.
    assert delta == {"zadd": 10, "hset": 20, "psetex": 20, "hincrby": 1, "lpush": 1, "exists": 0, "xadd": 2}
    assert await client.count_for_user("fred") == 20


async def test_enqueues_sent_together_survive_scripts_redis_lost(
    private_redis: PrivateRedis, settings: AgentSettings
) -> None:
    """SCRIPT FLUSH (as after a restart): the call meets NOSCRIPT, loads the script and is sent
    again; none is lost or doubled."""
    async with Agent(dataclasses.replace(settings, redis_url=private_redis.url)) as agent:
        client = ClientAgent(agent)
        await client.enqueue(Echo(text="warm"))
        await agent.job_store.redis.script_flush()
        ids = await asyncio.gather(*(client.enqueue(Echo(text=str(i))) for i in range(10)))
        assert len(set(ids)) == 10
        states = await asyncio.gather(*(client.get_state(job_id) for job_id in ids))
        assert [s.payload["text"] for s in states if s is not None] == [str(i) for i in range(10)]
        assert await agent.job_store.redis.zcard(agent.engine.names.queue) == 11
        assert agent.job_store.enqueues.stats.largest == 10


async def test_unreachable_redis_fails_every_enqueue_sent_together(agent: Agent, client: ClientAgent) -> None:
    store = agent.job_store
    reachable = store.redis
    dead = Redis(host="127.0.0.1", port=free_port())
    store.bind(dead)
    try:
        outcomes = await asyncio.gather(*(client.enqueue(Echo()) for _ in range(5)), return_exceptions=True)
    finally:
        store.bind(reachable)
        await dead.aclose()
    assert all(isinstance(o, QueueUnavailableError) and "could not enqueue" in str(o) for o in outcomes), outcomes
    assert await client.enqueue(Echo()) is not None


async def test_the_engines_record_of_a_job_reads_back_as_arqs_own(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """enqueue.lua writes arq's record of each job from the state's payload (queue.lua's
    engine_job_record): arq reads it back as the record engine/wire.py's serialize would write,
    byte for byte for a plain payload, value for value for one with quotes and non-ASCII text."""
    plain = await client.enqueue(Echo(text="x", numbers=[1, 2]))
    tricky = await client.enqueue(Echo(text='quote " slash / é \\ \u2028'))
    for job_id in (plain, tricky):
        state = await client.get_state(job_id)
        assert state is not None
        written = await redis.get(f"arq:job:{agent.engine.names.engine_job_id(job_id)}")
        expected = serialize(state.name, state.payload, state.created_ms)
        assert written is not None
        if job_id == plain:
            assert written == expected
        assert deserialize_job(written, deserializer=wire_loads) == deserialize_job(expected, deserializer=wire_loads)


async def test_a_new_states_other_fields_are_written_too(agent: Agent) -> None:
    """A state created with fields enqueue.lua does not take as arguments (a retry's `retry_of`, a
    status or attempts other than a new job's) keeps them."""
    state = JobState(job_id=new_job_id(), name=Echo.name, payload={"text": "x"}, retry_of="j0", attempts=2,
                     error="ValueError: before")
    await agent.job_store.create(state, gate=None, run=agent.engine.run_at())
    stored = await agent.job_store.get(state.job_id)
    assert stored is not None
    assert (stored.retry_of, stored.attempts, stored.error) == ("j0", 2, "ValueError: before")
    assert stored.payload == {"text": "x"}
    assert (stored.status, stored.created_ms) == (JobStatus.PENDING, state.created_ms)
