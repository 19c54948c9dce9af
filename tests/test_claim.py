"""The batch claim script (engine/claim.py, claim_batch.lua) on a real Redis: what it takes, what it
skips, and what it tells the worker to wait for."""

from __future__ import annotations

from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from agent_async.engine.claim import SERVER_NOW, Claimed, claim_call, parse_claim
from agent_async.engine.wire import EngineNames
from agent_async.lifecycle import now_ms
from agent_async.store import run_script

TTL_MS = 60_000


async def queue_jobs(
    redis: Redis, names: EngineNames, count: int, *, at_ms: int, claimed_elsewhere: int = 0
) -> list[str]:
    """`count` due engine ids in score order; the first `claimed_elsewhere` are in progress."""
    ids = [f"{names.namespace}:job-{i:03d}" for i in range(count)]
    await redis.zadd(names.queue, {engine_id: at_ms + i for i, engine_id in enumerate(ids)})
    for engine_id in ids[:claimed_elsewhere]:
        await redis.set(in_progress_key_prefix + engine_id, "1", px=TTL_MS)
    return ids


async def claim(
    redis: Redis, names: EngineNames, wanted: int, read_limit: int = 100, at: int | str | None = None, held: int = 0
) -> Claimed:
    call = claim_call(names.queue, names.wake_key, wanted=wanted, ttl_ms=TTL_MS, read_limit=read_limit, at=at,
                      held=held)
    return parse_claim(await run_script(redis, call))


async def test_one_free_slot_skips_jobs_claimed_elsewhere_past_the_first_page(redis: Redis, namespace: str) -> None:
    """40 due jobs, the first 35 run by other workers: a claim of 1 (its pages grow from 4 entries) still
    finds the 36th, marks it in progress, and says more are due."""
    names = EngineNames(namespace)
    ids = await queue_jobs(redis, names, 40, at_ms=now_ms() - 1000, claimed_elsewhere=35)
    got = await claim(redis, names, 1)
    assert [job for job, _ in got.jobs] == [ids[35]]
    assert got.next_ms == -1
    assert await redis.exists(in_progress_key_prefix + ids[35]) == 1
    rest = await claim(redis, names, 10)
    assert [job for job, _ in rest.jobs] == ids[36:]
    # All taken: nothing more due, none deferred; the wake list is dropped as stale.
    assert rest.next_ms == 0


async def test_a_read_limit_full_of_jobs_claimed_elsewhere_says_poll_again(redis: Redis, namespace: str) -> None:
    names = EngineNames(namespace)
    await queue_jobs(redis, names, 30, at_ms=now_ms() - 1000, claimed_elsewhere=30)
    got = await claim(redis, names, 5, read_limit=20)
    assert (got.jobs, got.next_ms) == ([], -2)


async def test_a_full_batch_says_whether_more_are_due(redis: Redis, namespace: str) -> None:
    names = EngineNames(namespace)
    ids = await queue_jobs(redis, names, 16, at_ms=now_ms() - 1000)
    first = await claim(redis, names, 8)
    assert [job for job, _ in first.jobs] == ids[:8] and first.next_ms == -1
    # Exactly the rest: the batch is full and nothing more is due.
    second = await claim(redis, names, 8)
    assert [job for job, _ in second.jobs] == ids[8:] and second.next_ms == 0


async def test_deferred_jobs_are_left_and_the_next_one_is_named(redis: Redis, namespace: str) -> None:
    """On Redis's clock (SERVER_NOW) as on the caller's: a deferred job is not taken; its score is
    the time to wait for."""
    names = EngineNames(namespace)
    later_ms = now_ms() + 60_000
    await redis.zadd(names.queue, {f"{namespace}:later": later_ms})
    for at in (None, SERVER_NOW):
        got = await claim(redis, names, 4, at=at)
        assert (got.jobs, got.next_ms) == ([], later_ms)


async def page_reads(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k == "cmdstat_zrangebyscore")


async def test_the_first_page_reads_past_the_jobs_the_worker_runs(redis: Redis, namespace: str) -> None:
    """A busy worker's claim says how many jobs it runs (`held`): they head the queue until they
    finish, and its first page reads past them, so it takes the next ones in one read of the queue;
    told nothing, it reads pages of growing length until it finds them."""
    names = EngineNames(namespace)
    ids = await queue_jobs(redis, names, 20, at_ms=now_ms() - 1000, claimed_elsewhere=7)
    before = await page_reads(redis)
    got = await claim(redis, names, 3, held=7)
    assert [job for job, _ in got.jobs] == ids[7:10]
    assert await page_reads(redis) - before == 1
    for engine_id in ids[7:10]:  # as if they ran elsewhere too: the next claim, told nothing, pages
        await redis.set(in_progress_key_prefix + engine_id, "1", px=TTL_MS)
    before = await page_reads(redis)
    got = await claim(redis, names, 3)
    assert [job for job, _ in got.jobs] == ids[10:13]
    assert await page_reads(redis) - before == 3  # 4, then 8, then 16 entries


async def test_an_idle_claim_reads_the_queue_once_past_jobs_claimed_elsewhere(redis: Redis, namespace: str) -> None:
    """20 due jobs, 18 of them run elsewhere, then a deferred one: the claim of an idle worker that
    runs nothing itself reads pages of due jobs of growing length (4, 8, then 16 entries), without
    their scores, then the next deferred job's score alone: four reads, none of the whole queue."""
    names = EngineNames(namespace)
    await queue_jobs(redis, names, 20, at_ms=now_ms() - 1000, claimed_elsewhere=18)
    later_ms = now_ms() + 60_000
    await redis.zadd(names.queue, {f"{namespace}:later": later_ms, f"{namespace}:later-still": later_ms + 1})
    stats = await redis.info("commandstats")
    before = {k: int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_zrange")}
    got = await claim(redis, names, 4)
    stats = await redis.info("commandstats")
    after = {k: int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_zrange")}
    assert [job for job, _ in got.jobs] == [f"{namespace}:job-018", f"{namespace}:job-019"]
    assert got.next_ms == later_ms
    reads = sum(after.values()) - sum(before.values())
    assert reads == 4, after
