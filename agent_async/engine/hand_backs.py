"""Claimed jobs that a worker will not run, going back to the queue as they were (start undone,
claim dropped, an idle worker woken): those a stop caught between their claim and their run, and
those of a claim call whose reply was lost.

A claim whose reply was lost: Redis ran the call (its jobs are in progress and started) but the
connection dropped before the reply came back (a Redis shutdown, a network cut). The worker that
sent it never learns which jobs it took; without this, each would sit out its lease and then be
settled as if its worker had died (FAILURE WorkerLost, for a job that may not resume), though it
never ran. Ours because the batch claim is ours: arq's own claim has the same blind spot and leaves
such a job until its in-progress key expires.

Each claim call writes a mark of its own in its jobs' in-progress keys (arq writes '1' and only
tests the key's existence). A call that fails with an outage error keeps its mark; once Redis
answers again, one read (lost_claims.lua) finds the started jobs holding one of those marks, and
the worker hands them back as it does any claimed job it will not run: start undone, claim
dropped, a worker woken. A mark names one send, never reused, so a job found is one no reply
announced: it cannot be running here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis
from redis.exceptions import RedisError

from agent_async.engine.wakeup import give_back_claim
from agent_async.engine.wire import EngineNames
from agent_async.outage import OUTAGE_ERRORS
from agent_async.store import LuaScript, lua_source, run_script

__all__ = ["HandBacks"]

logger = logging.getLogger(__name__)

_FIND = LuaScript(lua_source("agent_async.engine", "lost_claims.lua"))
# Marks kept at most (a long outage fails a claim every backoff step): the oldest go first. A
# mark dropped unsearched leaves its jobs to the lease, as before this existed.
_MAX_MARKS = 1000


class HandBacks:
    """One worker's hand-backs, and the marks of its claim calls (those whose reply never came)."""

    def __init__(
        self, *, pool: Callable[[], Redis], undo_start: Callable[[str], Awaitable[None]], names: EngineNames,
        leases_key: str,
    ) -> None:
        self._pool = pool
        self._undo_start = undo_start
        self._names = names
        self._leases_key = leases_key
        self._tasks: set[asyncio.Task[None]] = set()
        self._worker = secrets.token_hex(6)
        self._sends = itertools.count(1)
        self._lost: dict[str, None] = {}  # ordered: the oldest first

    def give_back(self, engine_id: str) -> None:
        """A claimed job nothing here will run: back to the queue, as it was (in a task: `wait`)."""
        task = asyncio.get_running_loop().create_task(self._give_back(engine_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self) -> None:
        """Until the hand-backs under way are done (before the worker closes its pool)."""
        if self._tasks:
            await asyncio.gather(*self._tasks)

    async def _give_back(self, engine_id: str) -> None:
        try:
            await self._undo_start(engine_id)
            await give_back_claim(self._pool(), in_progress_key_prefix + engine_id, self._names.wake_key)
        except Exception as exc:  # the lease runs out and recovery settles it
            logger.warning("job %s was claimed but never ran; handing it back failed: %r", engine_id, exc)

    def mark(self) -> str:
        """The mark of the next claim call (unique to this worker and this send)."""
        return f"{self._worker}.{next(self._sends)}"

    def lost(self, mark: str) -> None:
        """The call with this mark failed with an outage error: it may have run."""
        self._lost[mark] = None
        while len(self._lost) > _MAX_MARKS:
            del self._lost[next(iter(self._lost))]

    @property
    def pending(self) -> bool:
        return bool(self._lost)

    @contextmanager
    def sending(self) -> Iterator[str]:
        """The mark of a claim call sent in this block; lost if the send fails with an outage error."""
        mark = self.mark()
        try:
            yield mark
        except OUTAGE_ERRORS:
            self.lost(mark)
            raise

    async def give_back_lost_at_close(self) -> None:
        """The last search, as the worker stops: with Redis still away, recovery settles them."""
        if not self._lost:
            return
        try:
            await self.give_back_lost()
        except OUTAGE_ERRORS as exc:  # their leases run out, and recovery settles them
            logger.warning("jobs of claims whose reply was lost are left to recovery: %s", exc)

    async def give_back_lost(self) -> None:
        """Find the jobs that the lost calls claimed and started, and give each back. Their marks
        are forgotten once the search ran (an outage error leaves them for the next one)."""
        marks = list(self._lost)
        prefix = in_progress_key_prefix + self._names.engine_job_id("")
        try:
            found = await run_script(self._pool(), _FIND([self._leases_key], [prefix, json.dumps(marks)]))
        except OUTAGE_ERRORS:
            raise
        except RedisError as exc:  # not worth a retry at every iteration: the leases settle them
            found = []
            logger.warning("could not look for the jobs of claims whose reply was lost (%s); left to recovery", exc)
        for mark in marks:
            self._lost.pop(mark, None)
        for job_id in found:
            logger.warning("job %s was claimed by a call whose reply was lost; handing it back", job_id.decode())
            self.give_back(self._names.engine_job_id(job_id.decode()))
