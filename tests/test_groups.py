"""Fan-out groups: atomic creation, a sliding window, a finalizer exactly once with the counts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis

from agent_async import (
    Agent,
    AgentSettings,
    ClientAgent,
    GroupError,
    GroupFinalizer,
    Job,
    JobRequest,
    JobStatus,
    agent_job,
)
from agent_async.errors import QueueUnavailableError
from agent_async.groups import MAX_GROUP_CHILDREN
from agent_async.store.groups import GroupStatus
from tests.conftest import REDIS_URL, Drain, running_worker, wait_for_status
from tests.reply_loss import reply_losing_proxy


class Flaky(Exception):
    pass


def key(namespace: str, what: str) -> str:
    return f"{namespace}:tests:groups:{what}"


@dataclass
class Child(JobRequest):
    name: ClassVar[str] = "tests.groups.child"
    max_try: ClassVar[int] = 3
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (Flaky,)
    max_concurrent: ClassVar[int] = 1  # ignored inside a group: max_in_flight bounds it
    soft_timeout_seconds: ClassVar[float] = 30

    outcome: str = "ok"  # ok | fail | flaky (fails once, then succeeds) | sleep
    sleep_s: float = 0.0


@agent_job
class ChildJob(Job[Child]):
    request_class = Child

    async def process(self, request: Child, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        redis, ns = self.resources.redis, self.resources.namespace
        now = await redis.incr(key(ns, "in_flight"))
        await redis.eval("if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
                         "redis.call('SET', KEYS[1], ARGV[1]) end", 1, key(ns, "max_in_flight"), now)
        try:
            attempts = await redis.hincrby(key(ns, "attempts"), job_id, 1)
            if request.sleep_s:
                await asyncio.sleep(request.sleep_s)
            if request.outcome == "fail":
                raise ValueError("refused")
            if request.outcome == "flaky" and attempts == 1:
                raise Flaky("once")
            return {"ok": True}
        finally:
            await redis.decr(key(ns, "in_flight"))


@dataclass
class Final(GroupFinalizer):
    name: ClassVar[str] = "tests.groups.final"
    note: str = ""


@agent_job
class FinalJob(Job[Final]):
    request_class = Final

    async def process(self, request: Final, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        view = await self.resources.groups.get(request.group_id)
        assert view is not None
        record = {"note": request.note, "user": user_uid, **view.to_dict()}
        await self.resources.redis.rpush(key(self.resources.namespace, "finals"), json.dumps(record))
        return {"succeeded": view.succeeded, "failed": view.failed, "canceled": view.canceled}


async def finals(redis: Redis, namespace: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in await redis.lrange(key(namespace, "finals"), 0, -1)]


async def drain_until_final(drain: Drain, client: ClientAgent, group_id: str) -> dict[str, Any]:
    for _ in range(5):  # a retry's backoff or the finalizer queued last can need another pass
        await drain()
        view = await client.get_group(group_id)
        assert view is not None
        final = await client.get_state(view.finalizer_job_id)
        if final is not None and final.is_terminal:
            return view.to_dict()
        await asyncio.sleep(0.06)
    pytest.fail(f"the finalizer of {group_id} never ran: {view}")


async def test_finalizer_runs_once_with_counts_after_success_failure_and_retries(
    drain: Drain, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    children = [Child(), Child(), Child(outcome="fail"), Child(outcome="flaky"), Child(outcome="fail")]
    group_id = await client.enqueue_group(children, Final(note="n1"), user_uid="alice")
    view = await drain_until_final(drain, client, group_id)
    assert (view["succeeded"], view["failed"], view["canceled"], view["total"]) == (3, 2, 0, 5)
    assert view["status"] == GroupStatus.FINALIZED
    [final] = await finals(redis, namespace)
    assert (final["succeeded"], final["failed"], final["canceled"]) == (3, 2, 0), "a retried child counts once"
    assert len(final["failed_ids"]) == 2 and final["note"] == "n1" and final["user"] == "alice"
    for failed_id in final["failed_ids"]:
        state = await client.get_state(failed_id)
        assert state is not None and state.status is JobStatus.FAILURE
    await drain()
    assert len(await finals(redis, namespace)) == 1, "exactly once"


async def test_zero_children_fire_the_finalizer_at_once(drain: Drain, client: ClientAgent, redis: Redis,
                                                        namespace: str) -> None:
    group_id = await client.enqueue_group([], Final())
    view = await client.get_group(group_id)
    assert view is not None and view.status is GroupStatus.FINALIZED and view.total == 0
    await drain()
    [final] = await finals(redis, namespace)
    assert (final["succeeded"], final["failed"], final["canceled"], final["total"]) == (0, 0, 0, 0)


async def test_sliding_window_never_exceeds_max_in_flight(
    agent: Agent, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    group_id = await client.enqueue_group([Child(sleep_s=0.02) for _ in range(30)], Final(), max_in_flight=3)
    view = await client.get_group(group_id)
    assert view is not None and (view.in_flight, view.waiting) == (3, 27), "only the window is queued"
    async with running_worker(agent, max_jobs=10):
        final_id = view.finalizer_job_id
        deadline = asyncio.get_running_loop().time() + 30
        while (await client.get_state(final_id)) is None or not (await client.get_state(final_id)).is_terminal:  # type: ignore[union-attr]
            assert asyncio.get_running_loop().time() < deadline, "group not finished"
            await asyncio.sleep(0.05)
    assert int(await redis.get(key(namespace, "max_in_flight"))) == 3
    view = await client.get_group(group_id)
    assert view is not None and view.succeeded == 30 and view.waiting == 0 and view.in_flight == 0


async def test_cancel_group_cancels_queued_and_waiting_and_still_finalizes(
    drain: Drain, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    group_id = await client.enqueue_group([Child() for _ in range(6)], Final(), max_in_flight=2)
    view = await client.cancel_group(group_id)
    assert view is not None and view.cancel_requested and view.canceled == 6
    view = await drain_until_final(drain, client, group_id)
    [final] = await finals(redis, namespace)
    assert (final["succeeded"], final["failed"], final["canceled"]) == (0, 0, 6)
    assert await redis.hlen(key(namespace, "attempts")) == 0, "no child ran"


async def test_cancel_group_stops_running_children(agent: Agent, client: ClientAgent, redis: Redis,
                                                   namespace: str) -> None:
    group_id = await client.enqueue_group([Child(sleep_s=20) for _ in range(2)] + [Child()], Final(), max_in_flight=2)
    view = await client.get_group(group_id)
    assert view is not None
    async with running_worker(agent):
        deadline = asyncio.get_running_loop().time() + 10
        while int(await redis.get(key(namespace, "in_flight")) or 0) < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        await client.cancel_group(group_id)
        await wait_for_status(agent, view.finalizer_job_id, JobStatus.SUCCESS, timeout_s=15)
    [final] = await finals(redis, namespace)
    assert (final["succeeded"], final["failed"], final["canceled"]) == (0, 0, 3)


async def test_a_finalizer_that_cannot_be_queued_is_queued_by_recovery(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    """Injected failure: the finalizer's state key has the wrong type when the last child ends.
    The child still ends, the group is marked, and the recovery pass's sweep queues it later."""
    group_id = await client.enqueue_group([Child(), Child()], Final())
    view = await client.get_group(group_id)
    assert view is not None
    await redis.set(agent.keys.state(view.finalizer_job_id), "in the way")
    await drain()
    view = await client.get_group(group_id)
    assert view is not None and view.status is GroupStatus.FINAL_PENDING and view.succeeded == 2
    assert await agent.groups.finalize_pending() == 0, "still in the way: failed again, kept"
    await redis.delete(agent.keys.state(view.finalizer_job_id))
    assert await agent.groups.finalize_pending() == 1
    assert await agent.groups.finalize_pending() == 0
    await drain_until_final(drain, client, group_id)
    assert len(await finals(redis, namespace)) == 1


async def test_bad_groups_are_refused_before_anything_is_written(client: ClientAgent, redis: Redis,
                                                                 namespace: str) -> None:
    with pytest.raises(GroupError, match=f"at most {MAX_GROUP_CHILDREN} children"):
        await client.enqueue_group([Child()] * (MAX_GROUP_CHILDREN + 1), Final())
    with pytest.raises(GroupError, match="GroupFinalizer"):
        await client.enqueue_group([Child()], Child())  # type: ignore[arg-type]
    with pytest.raises(GroupError, match="max_in_flight"):
        await client.enqueue_group([Child()], Final(), max_in_flight=0)
    assert [k async for k in redis.scan_iter(match=f"{namespace}:*")] == []


async def test_group_keys_expire_with_the_retention_once_finalized(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    group_id = await client.enqueue_group([Child(outcome="fail")], Final())
    await drain_until_final(drain, client, group_id)
    group_key = agent.keys.group(group_id)
    for suffix in ("", ":ended", ":failed"):
        ttl = await redis.ttl(group_key + suffix)
        assert 0 < ttl <= agent.settings.state_retention_s, (suffix, ttl)


async def test_a_group_whose_reply_was_lost_is_created_once(
    drain: Drain, agent: Agent, client: ClientAgent, redis: Redis, namespace: str
) -> None:
    """The group's script ran in Redis and its reply was lost (the connection cut before it): the
    producer sends it again and gets the group, created once: two children queued, three waiting,
    one finalizer run. (Before, enqueue_group raised QueueUnavailableError for a group that
    existed; a second send without the resend mark is refused as a duplicate id.)"""
    script = agent.groups._groups._create
    await redis.script_load(script.source)  # the lost reply is a run's, not NOSCRIPT's
    async with reply_losing_proxy(REDIS_URL) as proxy:
        proxy.lose_reply_to(script.sha.encode())
        async with Agent(dataclasses.replace(agent.settings, redis_url=proxy.url)) as through_proxy:
            group_id = await ClientAgent(through_proxy).enqueue_group(
                [Child() for _ in range(5)], Final(note="once"), max_in_flight=2
            )
    assert proxy.lost == 1, "the group's reply was lost on the way"
    view = await client.get_group(group_id)
    assert view is not None and (view.total, view.in_flight, view.waiting) == (5, 2, 3)
    assert await redis.zcard(agent.engine.names.queue) == 2, "the first two children, queued once"
    view_after = await drain_until_final(drain, client, group_id)
    assert (view_after["succeeded"], view_after["failed"]) == (5, 0)
    assert [f["note"] for f in await finals(redis, namespace)] == ["once"]


async def test_only_the_same_send_is_taken_for_a_lost_group(agent: Agent, redis: Redis) -> None:
    """A resend is recognised by the group's creation millisecond: a group id that exists from
    another send is still refused, resent or not; only the resend of its very millisecond is
    answered as its send was (here: no child, 0 queued), and writes nothing."""
    script = agent.groups._groups._create
    group_id = "chosen-group"
    group = agent.keys.group(group_id)
    await redis.hset(group, mapping={"id": group_id, "created_ms": 1})
    for created_ms, resent, reply in ((2, False, -1), (2, True, -1), (1, False, -1), (1, True, 0)):
        call = script(
            [group, agent.keys.active_index, agent.keys.groups_final_pending],
            [group_id, created_ms, 60, 0, "", "final-id", "{}", "1" if resent else ""],
        )
        assert await agent.job_store.run(call) == reply, (created_ms, resent)
    assert await redis.hgetall(group) == {b"id": group_id.encode(), b"created_ms": b"1"}, "nothing written"


async def test_a_group_is_sent_again_while_redis_is_unreachable_then_names_itself() -> None:
    """Redis unreachable (a listener that drops every connection): enqueue_group is sent again for
    AGENT_ENQUEUE_RESEND_SECONDS, then QueueUnavailableError carries the group's id; 0: one send."""
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
            settings = AgentSettings(redis_url=f"redis://127.0.0.1:{port}/0", namespace="t-unreachable-group",
                                     enqueue_resend_s=resend_s)
            unreachable = Agent(settings)
            unreachable.job_store.bind(Redis.from_url(settings.redis_url))
            try:
                with pytest.raises(QueueUnavailableError) as raised:
                    await ClientAgent(unreachable).enqueue_group([Child()], Final())
            finally:
                await unreachable.job_store.redis.aclose()
            assert raised.value.group_id is not None and len(raised.value.group_id) == 32
            assert at_least <= connections <= at_most, (resend_s, connections)
    finally:
        server.close()
        await server.wait_closed()
