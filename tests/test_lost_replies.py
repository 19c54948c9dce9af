"""A write that ran in Redis but whose reply was lost (Redis went down right after it, or the
connection was cut) must not cost the job its outcome: the sender cannot tell it ran, and must
be able to send it again."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from redis.asyncio import Redis

from agent_async import Agent, ClientAgent, testing
from agent_async.engine.claim import CLAIM_WITH_PICKUP
from agent_async.engine.finish import FINISH_BATCH
from agent_async.lifecycle import JobStatus
from tests.conftest import REDIS_URL
from tests.jobs import NotResumable, runs_key
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
