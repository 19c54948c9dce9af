"""Enqueues in one script call (store/lua/enqueue.lua): the enqueues of concurrent callers
(`JobStore.create`, by group commit) and each round trip of `ClientAgent.enqueue_many`.

One call instead of one per job saves Redis each job's script set-up and argument decoding, and the
writes its jobs share (index entries after each key's first, counters, wake-up tokens) go out once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, TimeoutError

from agent_async.errors import EnqueueError, QueueUnavailableError
from agent_async.lifecycle import now_ms
from agent_async.store import codec
from agent_async.store.group_commit import GroupCommit, GroupStats
from agent_async.store.scripts import LuaScript, run_script

__all__ = ["MAX_BATCH", "BatchReply", "Enqueues", "PreparedEnqueue", "enqueue_errors"]

# Jobs per script call at most: a script runs as a whole, holding Redis (and every other client)
# for as long as it runs; 100 jobs cost it a few ms.
MAX_BATCH = 100


@dataclass(frozen=True, slots=True)
class PreparedEnqueue:
    """One job as enqueue_job.lua takes it (JobStore.prepare), built now and sent later."""

    fields: list[str]


@dataclass(frozen=True, slots=True)
class BatchReply:
    """One enqueue_many round trip's answer: one enqueue reply per job the script ran, in order;
    `error`, the text of the Redis error the job after those raised (then it and every job after
    it were not queued)."""

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


class Enqueues:
    """The enqueue script, for concurrent callers' jobs together (`one`) or for a batch (`batch`)."""

    def __init__(
        self, redis: Callable[[], Redis], script: LuaScript, *, constants: tuple[str, ...], retention_s: int
    ) -> None:
        # A getter: the store is bound to its client after it is built.
        self._redis = redis
        self.script = script
        # enqueue.lua's keys and prefixes (its ARGV after the jobs and the stop flag).
        self._constants = constants
        self._retention_ms = retention_s * 1000
        self._group: GroupCommit[PreparedEnqueue, int] = GroupCommit(self._send_together, max_batch=MAX_BATCH)

    @property
    def stats(self) -> GroupStats:
        return self._group.stats

    async def one(self, job: PreparedEnqueue) -> int:
        """Queue one job (with the concurrent callers' that are ready): enqueue_job.lua's reply.
        QueueUnavailableError if Redis is unreachable, EnqueueError if it refuses the call or this
        job (nothing of the job was written then)."""
        return await self._group.submit(job)

    async def _send_together(self, jobs: list[PreparedEnqueue]) -> list[int | BaseException]:
        # Each job on its own: one refused (or failing) job does not stop the others, which are
        # other callers'.
        with enqueue_errors("enqueue"):
            replies = await self._run(jobs, stop=False)
        return [EnqueueError(f"could not enqueue: {codec.text(r)}") if isinstance(r, bytes) else int(r)
                for r in replies]

    async def batch(self, jobs: Sequence[PreparedEnqueue]) -> BatchReply:
        """Queue the jobs of one enqueue_many round trip, stopping at the first Redis refuses.

        QueueUnavailableError if Redis is unreachable, EnqueueError if it refuses the call as a
        whole; in both cases no job of the batch was queued (a script runs whole or not at all).
        """
        with enqueue_errors("enqueue"):
            replies = await self._run(jobs, stop=True)
        if replies and isinstance(replies[-1], bytes):
            return BatchReply(replies[:-1], replies[-1].decode())
        return BatchReply(replies)

    async def _run(self, jobs: Sequence[PreparedEnqueue], *, stop: bool) -> list[Any]:
        # The indexes' entries older than the retention are pruned as they are written.
        argv = [json.dumps([job.fields for job in jobs]), "1" if stop else "", *self._constants,
                str(now_ms() - self._retention_ms)]
        return list(await run_script(self._redis(), self.script([], argv)))
