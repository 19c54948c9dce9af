"""The concurrency gate: max_concurrent 0, 1 and N, its scopes, and its release on every terminal path."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from agent_async import ERROR_JOB_CONCURRENT_LIMIT, Agent, ClientAgent, JobRequest, JobStatus, RequestException
from agent_async.worker import JobRecovery
from tests.conftest import Drain
from tests.jobs import Boom, Echo, Flaky, Gated, GatedFive, NoWorker, Slow


async def enqueue_many(client: ClientAgent, make: type[JobRequest], n: int, user: str | None) -> list[str | None]:
    async def one() -> str | None:
        try:
            return await client.enqueue(make(), user)
        except RequestException as exc:
            assert exc.code == ERROR_JOB_CONCURRENT_LIMIT
            return None

    return await asyncio.gather(*(one() for _ in range(n)))


async def slots(agent: Agent, name: str, user: str | None) -> int:
    return await agent.job_store.slots_held(agent.keys.gate(name, user))


async def test_gate_off_lets_everything_through(agent: Agent, client: ClientAgent) -> None:
    """max_concurrent 0: 50 concurrent enqueues all succeed and no slot key is written."""
    ids = await enqueue_many(client, Echo, 50, "u")
    assert all(ids)
    assert await slots(agent, Echo.name, "u") == 0


async def test_gate_one_refuses_a_second_job_in_flight(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    """max_concurrent 1: the second enqueue gets ERROR_JOB_CONCURRENT_LIMIT until the first ends."""
    first = await client.enqueue(Gated(), "u")
    with pytest.raises(RequestException) as caught:
        await client.enqueue(Gated(), "u")
    assert caught.value.code == ERROR_JOB_CONCURRENT_LIMIT
    assert "1 job(s) already in flight" in caught.value.message
    await drain()
    assert (await client.get_state(first)).status is JobStatus.SUCCESS  # type: ignore[union-attr]
    assert await slots(agent, Gated.name, "u") == 0
    assert await client.enqueue(Gated(), "u")


@pytest.mark.parametrize(("request_class", "limit"), [(Gated, 1), (GatedFive, 5)])
async def test_fifty_concurrent_enqueues_let_exactly_n_through(
    agent: Agent, client: ClientAgent, request_class: type[JobRequest], limit: int
) -> None:
    """50 enqueues racing for the same (name, user): exactly max_concurrent of them win."""
    ids = await enqueue_many(client, request_class, 50, "racer")
    accepted = [i for i in ids if i]
    assert len(accepted) == limit
    assert await slots(agent, request_class.name, "racer") == limit
    # The refused ones left nothing behind: only the accepted states exist for this user.
    assert {s.job_id for s in await client.list_for_user("racer")} == set(accepted)


async def test_scope_is_per_user_and_global_without_user(agent: Agent, client: ClientAgent) -> None:
    """One slot per user; system jobs (no user) share the `_global` slot."""
    assert await client.enqueue(Gated(), "u1")
    assert await client.enqueue(Gated(), "u2")
    assert await client.enqueue(Gated())
    for user in ("u1", "u2", None):
        with pytest.raises(RequestException):
            await client.enqueue(Gated(), user)
    assert await slots(agent, Gated.name, None) == 1


async def test_slot_released_on_failure_and_retries_exhausted(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    """FAILURE (direct, or after the last retry) frees the slot."""
    await client.enqueue(Boom(), "u")
    await client.enqueue(Boom(), "u")
    assert await slots(agent, Boom.name, "u") == 2
    await drain()
    assert await slots(agent, Boom.name, "u") == 0


async def test_slot_held_across_retries_and_released_at_the_end(
    drain: Drain, agent: Agent, client: ClientAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RETRY keeps the slot (the job is still in flight); the final outcome releases it."""
    monkeypatch.setattr(Flaky, "max_concurrent", 1)
    job_id = await client.enqueue(Flaky(fail_times=1), "u")
    seen_at_start: list[int] = []
    runner = agent.worker.runner(Flaky.name)
    original = runner.run

    async def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        # Before attempt 2 the state was RETRY: the slot must still be held then.
        seen_at_start.append(await slots(agent, Flaky.name, "u"))
        return await original(*args, **kwargs)

    monkeypatch.setattr(runner, "run", spy)
    await drain()
    assert seen_at_start == [1, 1]
    assert (await client.get_state(job_id)).status is JobStatus.SUCCESS  # type: ignore[union-attr]
    assert await slots(agent, Flaky.name, "u") == 0


async def test_slot_released_on_soft_timeout(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    await client.enqueue(Slow(sleep_s=5), "u")
    await drain()
    assert await slots(agent, Slow.name, "u") == 0


async def test_slot_released_on_cancel(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Gated(), "u")
    state = await client.cancel(job_id)
    assert state is not None and state.status is JobStatus.CANCELED
    assert await slots(agent, Gated.name, "u") == 0


async def test_slot_released_when_the_engine_drops_the_job(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    """A job arq drops without a hook (function unknown to the worker) still frees its slot."""
    job_id = await client.enqueue(NoWorker(), "u")
    await drain()
    # Only the plain arq worker needs the recovery pass.
    await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0)
    state = await client.get_state(job_id)
    assert state is not None and state.status is JobStatus.FAILURE
    assert await slots(agent, NoWorker.name, "u") == 0


async def test_slot_ttl_is_a_safety_net(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    """A slot whose holder never ends expires after the longest possible run + 60 s."""
    job_id = await client.enqueue(Gated(), "u")
    gate_key = agent.keys.gate(Gated.name, "u")
    score = await redis.zscore(gate_key, job_id)
    state = await client.get_state(job_id)
    assert state is not None and score is not None
    settings = agent.settings
    longest_run_s = Gated.soft_timeout_seconds + max(settings.hard_timeout_grace_s, settings.cancel_grace_s) + 2
    expected_ms = (longest_run_s + 60) * 1000
    assert score - state.created_ms == pytest.approx(expected_ms, abs=5)
    # Once that time has passed the slot no longer counts.
    await redis.zadd(gate_key, {job_id: 1})
    assert await slots(agent, Gated.name, "u") == 0
    assert await client.enqueue(Gated(), "u")
