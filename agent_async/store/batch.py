"""Many enqueues in one script call (ClientAgent.enqueue_many): store/lua/enqueue_many.lua."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, TimeoutError

from agent_async.errors import EnqueueError, QueueUnavailableError
from agent_async.store.scripts import LuaScript, ScriptCall, run_script

__all__ = ["BatchReply", "enqueue_errors", "run_batch"]


@dataclass(frozen=True, slots=True)
class BatchReply:
    """enqueue_many.lua's answer: one enqueue reply per job it ran, in order; `error`, the text of
    the Redis error the job after those raised (then it and every job after it were not queued)."""

    replies: list[Any]
    error: str | None = None


@contextmanager
def enqueue_errors(what: str) -> Iterator[None]:
    """Redis's failures of an enqueue script as the library's: QueueUnavailableError when Redis is
    unreachable, EnqueueError when it refuses the call (in both cases the script did not run)."""
    try:
        yield
    except (RedisConnectionError, TimeoutError) as exc:
        raise QueueUnavailableError(f"could not {what}: Redis is unreachable ({exc})") from exc
    except RedisError as exc:
        raise EnqueueError(f"could not {what}: {exc}") from exc


async def run_batch(redis: Redis, script: LuaScript, calls: Sequence[ScriptCall]) -> BatchReply:
    """Run enqueue calls (JobStore.create_call's) through `script` (enqueue_many.lua) in one call.

    QueueUnavailableError if Redis is unreachable, EnqueueError if it refuses the call as a whole;
    in both cases no job of the batch was queued (a script runs whole or not at all).
    """
    call = script([], [json.dumps([c.texts() for c in calls])])
    with enqueue_errors("enqueue"):
        replies = list(await run_script(redis, call))
    if replies and isinstance(replies[-1], bytes):
        return BatchReply(replies[:-1], replies[-1].decode())
    return BatchReply(replies)
