"""JobStore: indexes stay consistent and bounded; terminal states expire."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, JobStatus
from agent_async.store.scripts import PRUNE_EVERY
from tests.conftest import Drain, run_burst
from tests.faults.conftest import PrivateRedis
from tests.jobs import Boom, Echo, Flaky


async def test_indexes_are_consistent_after_many_jobs(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """300 jobs of 3 users, mixed outcomes: every user's list holds exactly their jobs, newest
    first; the active index is empty once all are terminal."""
    rng = random.Random(7)
    expected: dict[str | None, list[str]] = {"ann": [], "ben": [], "cat": [], None: []}
    booms: dict[str | None, int] = dict.fromkeys(expected, 0)
    for i in range(300):
        user = rng.choice(list(expected))
        request = rng.choice([Echo(text=str(i)), Boom(), Flaky(fail_times=1)])
        if isinstance(request, Boom):
            # Boom is gated at 2 in flight per user: stay under it.
            booms[user] += 1
            request = request if booms[user] <= Boom.max_concurrent else Echo(text="not gated")
        expected[user].append(await client.enqueue(request, user))
        await asyncio.sleep(0) if i % 50 else await asyncio.sleep(0.002)
    assert len(await agent.job_store.active_job_ids()) == 300

    await drain()

    assert await agent.job_store.active_job_ids() == []
    for user, ids in expected.items():
        if user is None:
            continue
        listed = await client.list_for_user(user, limit=500)
        assert [s.job_id for s in listed] == [s.job_id for s in sorted(listed, key=lambda s: -s.created_ms)]
        assert {s.job_id for s in listed} == set(ids)
        assert all(s.is_terminal and s.user_uid == user for s in listed)
        assert await agent.job_store.count_for_user(user) == len(ids)
    # System jobs are in no user index.
    assert not await redis.exists(agent.keys.user_index(""))


async def test_pagination_newest_first(agent: Agent, client: ClientAgent) -> None:
    ids = []
    for i in range(5):
        ids.append(await client.enqueue(Echo(text=str(i)), "pager"))
        await asyncio.sleep(0.002)
    page1 = await client.list_for_user("pager", offset=0, limit=2)
    page2 = await client.list_for_user("pager", offset=2, limit=2)
    page3 = await client.list_for_user("pager", offset=4, limit=2)
    assert [s.job_id for s in page1 + page2 + page3] == list(reversed(ids))


async def test_terminal_states_expire_after_retention(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    job_id = await client.enqueue(Echo())
    pending_ttl = await redis.ttl(agent.keys.state(job_id))
    await drain()
    done_ttl = await redis.ttl(agent.keys.state(job_id))
    assert pending_ttl == -1, "a live job never expires"
    assert 0 < done_ttl <= agent.settings.state_retention_s


async def test_indexes_are_pruned_once_states_expire(settings: AgentSettings, redis: Redis) -> None:
    """With a 1 s retention, index entries of expired states are dropped by later enqueues and reads."""
    short = AgentSettings(**{**{f: getattr(settings, f) for f in settings.ENV}, "state_retention_s": 1})
    async with Agent(short) as agent:
        client = ClientAgent(agent)
        for _ in range(4):
            await client.enqueue(Echo(), "old")
        await run_burst(agent)
        assert await redis.zcard(agent.keys.user_index("old")) == 4
        await asyncio.sleep(2.1)
        survivor = await client.enqueue(Echo(), "old")
        assert await redis.zrange(agent.keys.user_index("old"), 0, -1) == [survivor.encode()]
        # The read path drops dead entries too (e.g. a user who never enqueues again).
        await redis.zadd(agent.keys.user_index("old"), {"ghost": 1})
        assert [s.job_id for s in await client.list_for_user("old")] == [survivor]
        assert await redis.zrange(agent.keys.user_index("old"), 0, -1) == [survivor.encode()]


async def test_the_shared_indexes_are_pruned_every_few_jobs_and_stay_bounded(
    settings: AgentSettings, redis: Redis
) -> None:
    """The all-jobs, name and status indexes gain an entry with every job: their expired entries
    are dropped by a later enqueue or end (every PRUNE_EVERY-th, by the count the script holds),
    so none of them keeps the states of an earlier retention window."""
    short = AgentSettings(**{**{f: getattr(settings, f) for f in settings.ENV}, "state_retention_s": 1})
    async with Agent(short) as agent:
        client = ClientAgent(agent)
        old = [await client.enqueue(Echo()) for _ in range(PRUNE_EVERY)]
        await run_burst(agent)
        keys = agent.keys
        indexes = [keys.all_index, keys.name_index(Echo.name), keys.status_index(JobStatus.SUCCESS.value)]
        assert [await redis.zcard(index) for index in indexes] == [len(old)] * 3
        await asyncio.sleep(2.1)  # every old state has expired
        new = [await client.enqueue(Echo()) for _ in range(PRUNE_EVERY)]
        await run_burst(agent)
        for index in indexes:
            assert sorted(await redis.zrange(index, 0, -1)) == sorted(job_id.encode() for job_id in new), index


async def test_the_shared_indexes_are_not_read_for_pruning_at_every_job(
    private_redis: PrivateRedis, tmp_path: Path
) -> None:
    """The prune's read of an index every job writes (ZRANGEBYSCORE, a few microseconds of Redis
    each even when it finds nothing) runs once per PRUNE_EVERY jobs, not once per job and index.
    Counted with Redis's slow log at a 0 threshold, which records the calls scripts make too."""
    settings = AgentSettings(
        redis_url=private_redis.url, namespace="prune", database_url=f"sqlite+aiosqlite:///{tmp_path}/a.db"
    )
    jobs = 4 * PRUNE_EVERY
    async with Agent(settings) as agent:
        client = ClientAgent(agent)
        redis = agent.job_store.redis
        await redis.config_set("slowlog-max-len", 100_000)
        await redis.config_set("slowlog-log-slower-than", 0)
        for _ in range(jobs):
            await client.enqueue(Echo())
        enqueue_reads = await _index_reads(redis)
        await run_burst(agent)
        end_reads = await _index_reads(redis)
    # Pruned per job, it was one read per enqueue (the all-jobs index) and two per end (the name
    # and status indexes).
    assert 1 <= enqueue_reads <= jobs // PRUNE_EVERY
    assert 2 <= end_reads <= 2 * jobs // PRUNE_EVERY


async def _index_reads(redis: Redis) -> int:
    """ZRANGEBYSCORE calls on the indexes every job writes since the last call (then the log is
    reset). The active index is read by the recovery pass: not counted."""
    entries = await redis.execute_command("SLOWLOG", "GET", 100_000)
    await redis.slowlog_reset()
    shared = (b"prune:idx:all", b"prune:idx:name:", b"prune:idx:status:")
    return sum(1 for entry in entries if entry[3][0].upper() == b"ZRANGEBYSCORE" and entry[3][1].startswith(shared))


async def test_state_round_trips_through_dict(drain: Drain, agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Echo(text="é", numbers=[1]), "u")
    await drain()
    state = await client.get_state(job_id)
    assert state is not None
    from agent_async import JobState

    again = JobState.from_dict(state.to_dict())
    assert again == state
    assert state.to_dict()["status"] == JobStatus.SUCCESS.value
    assert state.to_dict()["finished_at"].endswith("+00:00")


async def test_enqueue_carries_any_text_through_its_packed_arguments(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """The enqueue script's keys and arguments travel as one JSON argument (LuaScript packed=True,
    decoded by cjson): text outside ASCII, outside the BMP, escapes and controls arrive as sent."""
    text = 'héllo 😀 \u2028 \x7f 日本 \\ " \n\t end'
    job_id = await client.enqueue(Echo(text=text), "usér-😀")
    state = await client.get_state(job_id)
    assert state is not None and state.payload["text"] == text and state.user_uid == "usér-😀"
    raw = await redis.hget(agent.keys.state(job_id), "user")
    assert raw == "usér-😀".encode()
    assert await redis.zscore(agent.keys.user_index("usér-😀"), job_id) is not None
