"""A write that ran in Redis but whose reply was lost (Redis went down right after it, or the
connection was cut) must not cost the job its outcome: the sender cannot tell it ran, and must
be able to send it again."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, testing
from agent_async.engine.claim import CLAIM_WITH_PICKUP
from agent_async.engine.finish import FINISH_BATCH
from agent_async.errors import DuplicateJobError, QueueUnavailableError
from agent_async.lifecycle import JobStatus
from agent_async.state import JobState
from agent_async.store.events import JobEvent
from tests.conftest import REDIS_URL
from tests.jobs import Echo, Gated, GatedFive, NotResumable, runs_key
from tests.reply_loss import reply_losing_proxy


async def test_a_start_whose_reply_was_lost_is_recognised_when_sent_again(agent: Agent, client: ClientAgent) -> None:
    store = agent.job_store
    job_id = await client.enqueue(NotResumable())
    first = await store.start(job_id, started_ms=1_000)  # its reply is what the sender never saw
    again = await store.start(job_id, started_ms=1_000, resent=True)
    assert first.run and again.run and again.attempts == first.attempts == 1
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.STARTED and state.attempts == 1


async def test_a_start_that_is_not_the_same_send_is_still_a_redelivery(agent: Agent, client: ClientAgent) -> None:
    """Only the very send (same start time, marked as sent again) is taken for its own start: a
    redelivery of a job whose worker was lost still ends it (resume off), resent or not."""
    store = agent.job_store
    lost_worker, resent_elsewhere = await client.enqueue(NotResumable()), await client.enqueue(NotResumable())
    for job_id in (lost_worker, resent_elsewhere):
        assert (await store.start(job_id, started_ms=1_000)).run
    redelivered = await store.start(lost_worker, started_ms=1_000)
    other_send = await store.start(resent_elsewhere, started_ms=2_000, resent=True)
    for job_id, decision in ((lost_worker, redelivered), (resent_elsewhere, other_send)):
        assert not decision.run and "worker was lost" in decision.reason
        state = await client.get_state(job_id)
        assert state is not None and state.status is JobStatus.FAILURE
        assert state.error is not None and state.error.startswith("WorkerLost")


async def test_the_stock_worker_runs_a_job_once_when_its_start_reply_is_lost(
    agent: Agent, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    """arq's stock Worker sends the START itself (on_job_start). Its reply is lost once: the job
    still runs once and ends SUCCESS, instead of being taken for the redelivery of a lost run
    (FAILURE, WorkerLost, for a job that may not resume) when arq hands it out again."""
    job_id = await client.enqueue(NotResumable())
    async with reply_losing_proxy(REDIS_URL) as proxy:
        proxy.lose_reply_to(agent.job_store._start.sha.encode())
        async with Agent(dataclasses.replace(agent.settings, redis_url=proxy.url)) as through_proxy:
            await testing.drain(through_proxy, stock_worker=True)
    assert proxy.lost == 1, "the start's reply was lost on the way"
    state = await client.get_state(job_id)
    assert state is not None, "the job has a state"
    assert (state.status, state.error, state.attempts) == (JobStatus.SUCCESS, None, 1)
    assert state.result == {"runs": 1}
    assert await redis.hget(runs_key(namespace), job_id) == b"1"


@pytest.mark.parametrize("lost", ["claim", "finish"])
async def test_the_fast_worker_hands_back_the_jobs_of_a_claim_whose_reply_was_lost(
    agent: Agent, client: ClientAgent, redis: Redis, namespace: str, lost: str
) -> None:
    """The fast worker's claim starts the jobs it takes (pickup.lua). The reply of one claim is
    lost: of the loop's own claim call ("claim"), or of a finish call, which also claims jobs for
    the slot it frees ("finish", one slot). The jobs it took were started and are run by no one:
    the worker finds them by the call's mark and hands them back; each then runs once. (Before,
    they sat out their lease and ended FAILURE, WorkerLost, though they never ran.)"""
    ids = [await client.enqueue(NotResumable()) for _ in range(3)]  # its concurrency limit
    body = CLAIM_WITH_PICKUP if lost == "claim" else FINISH_BATCH
    script = (agent.job_store.starting_in if lost == "claim" else agent.job_store.ending_in)(body)[0]
    await redis.script_load(script.source)  # the lost reply is a run's, not NOSCRIPT's
    async with reply_losing_proxy(REDIS_URL) as proxy:
        proxy.lose_reply_to(script.sha.encode())
        # A lease far longer than the test: only the hand-back can bring the jobs back in time.
        settings = dataclasses.replace(agent.settings, redis_url=proxy.url, lease_s=600.0)
        async with Agent(settings) as through_proxy:
            async with asyncio.timeout(30):  # before the hand-back, the drain waited out the lease
                await testing.drain(through_proxy, max_jobs=1 if lost == "finish" else 10)
    assert proxy.lost == 1
    states = [await client.get_state(job_id) for job_id in ids]
    assert [(s.status, s.error, s.attempts) for s in states if s is not None] == [(JobStatus.SUCCESS, None, 1)] * 3
    assert {k.decode(): int(v) for k, v in (await redis.hgetall(runs_key(namespace))).items()} == dict.fromkeys(ids, 1)


T = TypeVar("T")


async def _events_of(client: ClientAgent, job_id: str) -> AsyncIterator[JobEvent]:
    async for event in client.events(job_id=job_id, idle_s=0.2):
        if event is None:
            return
        yield event


async def _enqueued_through_a_lost_reply(agent: Agent, send: Callable[[ClientAgent], Awaitable[T]]) -> T:
    """`send` from a client whose first enqueue call runs in Redis and loses its reply."""
    script = agent.job_store.enqueues.script
    await agent.job_store.redis.script_load(script.source)  # the lost reply is a run's, not NOSCRIPT's
    async with reply_losing_proxy(REDIS_URL) as proxy:
        proxy.lose_reply_to(script.sha.encode())
        async with Agent(dataclasses.replace(agent.settings, redis_url=proxy.url)) as through_proxy:
            reply = await send(ClientAgent(through_proxy))
    assert proxy.lost == 1, "the enqueue's reply was lost on the way"
    return reply


async def test_an_enqueue_whose_reply_was_lost_queues_the_job_once(
    agent: Agent, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    """The enqueue ran, its reply was lost: the producer sends it again and is told "queued", with
    the job queued once. (Before, the producer got QueueUnavailableError for a job that existed; a
    second send without the resend mark would find the job's own gate slot taken and refuse it.)"""
    job_id = await _enqueued_through_a_lost_reply(agent, lambda c: c.enqueue(Gated(), user_uid="u1"))
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.PENDING
    gate = agent.keys.gate(Gated.name, "u1")
    assert await redis.zrange(gate, 0, -1) == [job_id.encode()], "one gate slot, the job's"
    assert await redis.zcard(agent.engine.names.queue) == 1
    events = [e async for e in _events_of(client, job_id)]
    assert [e.status for e in events] == [JobStatus.PENDING], "one PENDING event"
    await testing.drain(agent)
    assert await redis.hget(runs_key(namespace), job_id) == b"1"


async def test_an_enqueue_many_whose_reply_was_lost_queues_each_job_once(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """The same for a round trip of enqueue_many: every job accepted once, the gate's five slots
    taken once each (a second send without the mark would have found them full)."""
    results = await _enqueued_through_a_lost_reply(agent, lambda c: c.enqueue_many([GatedFive()] * 5))
    assert all(r.accepted for r in results), [r.reason for r in results]
    ids = {r.job_id for r in results}
    assert len(ids) == 5
    assert {m.decode() for m in await redis.zrange(agent.keys.gate(GatedFive.name, None), 0, -1)} == ids
    assert await redis.zcard(agent.engine.names.queue) == 5


async def test_only_the_same_send_is_taken_for_a_lost_enqueue(agent: Agent, client: ClientAgent) -> None:
    """A resend is recognised by the state's creation millisecond: another job under a chosen id
    that exists is still refused as a duplicate, resent or not."""
    store, run = agent.job_store, agent.engine.run_at(0)
    first = JobState(job_id="chosen-1", name=Echo.name, user_uid=None, payload={"text": "a"})
    await store.create(first, gate=None, run=run)
    sent_twice = store.prepare(first, gate=None, run=run)
    assert await store.enqueues.one(sent_twice.resent()) == 1, "the very send: queued"
    other = dataclasses.replace(first, created_ms=first.created_ms + 1)
    assert await store.enqueues.one(store.prepare(other, gate=None, run=run).resent()) == -1
    with pytest.raises(DuplicateJobError):
        await store.create(other, gate=None, run=run)


async def test_an_enqueue_is_sent_again_while_redis_is_unreachable_then_names_its_job() -> None:
    """Redis unreachable (a listener that drops every connection): the enqueue is sent again for
    AGENT_ENQUEUE_RESEND_SECONDS, then QueueUnavailableError carries the job's id; 0: one send."""
    connections = 0

    async def drop(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for resend_s, at_least, at_most in ((0.0, 1, 1), (0.5, 3, 12)):
            connections = 0
            settings = AgentSettings(redis_url=f"redis://127.0.0.1:{port}/0", namespace="t-unreachable",
                                     enqueue_resend_s=resend_s)
            agent = Agent(settings)
            agent.job_store.bind(Redis.from_url(settings.redis_url))
            try:
                with pytest.raises(QueueUnavailableError) as raised:
                    await ClientAgent(agent).enqueue(Echo(text="x"))
            finally:
                await agent.job_store.redis.aclose()
            assert raised.value.job_id is not None and len(raised.value.job_id) == 32
            assert at_least <= connections <= at_most, (resend_s, connections)
    finally:
        server.close()
        await server.wait_closed()
