"""Many store scripts in one round trip (ClientAgent.enqueue_many)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, TimeoutError

from agent_async.errors import EnqueueError, QueueUnavailableError
from agent_async.store.scripts import ScriptCall

__all__ = ["run_scripts"]


async def run_scripts(redis: Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    """EVALSHA each call inside one MULTI/EXEC: one round trip, and either every script runs or
    none does (a connection lost before EXEC queues nothing). Each script keeps its own checks.

    Scripts Redis had lost (NOSCRIPT: a restart, a flush) did not run: they are loaded and sent
    once more. QueueUnavailableError if Redis is unreachable, EnqueueError if it refuses one.
    """
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for _ in range(2):
        try:
            async with redis.pipeline(transaction=True) as pipe:
                for i in todo:
                    calls[i].queue_on(pipe)
                sent = await pipe.execute(raise_on_error=False)
        except (RedisConnectionError, TimeoutError) as exc:
            raise QueueUnavailableError(f"could not enqueue: Redis is unreachable ({exc})") from exc
        for i, reply in zip(todo, sent, strict=True):
            replies[i] = reply
        todo = [i for i in todo if isinstance(replies[i], NoScriptError)]
        if not todo:
            break
        for source in {calls[i].script.source for i in todo}:
            await redis.script_load(source)
    for reply in replies:
        if isinstance(reply, Exception):
            raise EnqueueError(f"could not enqueue: {reply}")
    return replies
