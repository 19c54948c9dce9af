"""Enqueues in one script call (store/lua/enqueue.lua): the enqueues of concurrent callers
(`JobStore.create`, by group commit) and each round trip of `ClientAgent.enqueue_many`.

One call instead of one per job saves Redis each job's script set-up and argument decoding, and the
writes its jobs share (index entries after each key's first, counters, wake-up tokens) go out once.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, TimeoutError

from agent_async.errors import EnqueueError, QueueUnavailableError
from agent_async.lifecycle import now_ms
from agent_async.outage import send_through_outage
from agent_async.store import codec
from agent_async.store.group_commit import GroupCommit, GroupStats
from agent_async.store.scripts import LuaScript, run_script

__all__ = ["MAX_BATCH", "BatchReply", "Enqueues", "IdCheck", "PreparedEnqueue", "enqueue_errors"]

R = TypeVar("R")

# Jobs per script call at most: a script runs as a whole, holding Redis (and every other client)
# for as long as it runs; 100 jobs cost it a few ms.
MAX_BATCH = 100


class IdCheck(StrEnum):
    """What enqueue_job.lua does with a job whose id exists."""

    # The id was just drawn by new_job_id (128 random bits): it cannot exist, so no check (one
    # Redis command of an enqueue's dozen).
    DRAWN = "1"
    # The caller chose the id (a schedule's fire, `Agent.create_job(job_id=...)`): refused.
    CHOSEN = "0"
    # Sent again after a send that failed: a state of this id created at this job's very
    # millisecond is that send's, which ran though its reply was lost; the job is queued (once).
    RESENT = "2"


# Where enqueue_job.lua's fields hold the IdCheck (its ARGV list, 0-based here).
_ID_CHECK_FIELD = 14


@dataclass(frozen=True, slots=True)
class PreparedEnqueue:
    """One job as enqueue_job.lua takes it (JobStore.prepare), built now and sent later."""

    fields: list[str]

    def resent(self) -> PreparedEnqueue:
        """The same job, to send again after a send that failed (IdCheck.RESENT)."""
        fields = list(self.fields)
        fields[_ID_CHECK_FIELD] = IdCheck.RESENT
        return PreparedEnqueue(fields)


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
        self, redis: Callable[[], Redis], script: LuaScript, *, constants: tuple[str, ...], retention_s: int,
        resend_s: float = 0.0,
    ) -> None:
        # A getter: the store is bound to its client after it is built.
        self._redis = redis
        self.script = script
        # How long an enqueue is sent again while Redis is unreachable (AgentSettings.enqueue_resend_s).
        self._resend_s = resend_s
        # enqueue.lua's keys and prefixes (its ARGV after the jobs and the stop flag).
        self._constants = constants
        self._retention_ms = retention_s * 1000
        self._group: GroupCommit[PreparedEnqueue, int] = GroupCommit(self._send_together, max_batch=MAX_BATCH)

    @property
    def stats(self) -> GroupStats:
        return self._group.stats

    async def one(self, job: PreparedEnqueue) -> int:
        """Queue one job (with the concurrent callers' that are ready): enqueue_job.lua's reply.
        QueueUnavailableError if Redis stayed unreachable while it was sent again, EnqueueError if
        it refuses the call or this job (nothing of the job was written then, unless by a send
        whose reply was lost)."""
        return await self._resending(lambda resent: self._group.submit(job.resent() if resent else job))

    async def _send_together(self, jobs: list[PreparedEnqueue]) -> list[int | BaseException]:
        # Each job on its own: one refused (or failing) job does not stop the others, which are
        # other callers'.
        with enqueue_errors("enqueue"):
            replies = await self._run(jobs, stop=False)
        return [EnqueueError(f"could not enqueue: {codec.text(r)}") if isinstance(r, bytes) else int(r)
                for r in replies]

    async def batch(self, jobs: Sequence[PreparedEnqueue]) -> BatchReply:
        """Queue the jobs of one enqueue_many round trip, stopping at the first Redis refuses.

        QueueUnavailableError if Redis stayed unreachable while it was sent again, EnqueueError if
        it refuses the call as a whole; in both cases no job of the batch was queued (a script runs
        whole or not at all), unless by a send whose reply was lost (then as its replies said).
        """
        return await self._resending(lambda resent: self._batch_once([j.resent() for j in jobs] if resent else jobs))

    async def _batch_once(self, jobs: Sequence[PreparedEnqueue]) -> BatchReply:
        with enqueue_errors("enqueue"):
            replies = await self._run(jobs, stop=True)
        if replies and isinstance(replies[-1], bytes):
            return BatchReply(replies[:-1], replies[-1].decode())
        return BatchReply(replies)

    async def _resending(self, send: Callable[[bool], Awaitable[R]]) -> R:
        # A send that failed may have run (its reply lost): the one after it says it is resent, so
        # that the script queues a job once however many sends ran (IdCheck.RESENT).
        return await send_through_outage(send, for_s=self._resend_s, errors=(QueueUnavailableError,))

    async def _run(self, jobs: Sequence[PreparedEnqueue], *, stop: bool) -> list[Any]:
        # The indexes' entries older than the retention are pruned as they are written.
        argv = [json.dumps([job.fields for job in jobs]), "1" if stop else "", *self._constants,
                str(now_ms() - self._retention_ms)]
        return list(await run_script(self._redis(), self.script([], argv)))
