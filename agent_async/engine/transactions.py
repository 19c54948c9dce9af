"""arq's per-job transactions as the fast worker sends them: the pickup answered from the claim,
our outcome inside the finish, and the finishes of jobs that end together sent as one MULTI/EXEC.

arq opens one transaction to pick a job up (GET job, INCR tries) and one to finish it (delete its
keys, store its result). The fast worker's claim already did the pickup (pickup.lua, with the START
transition): arq's pickup is answered from the claim's reply (`PoolWithPickup`). The outcome goes in
front of arq's finish (`PoolWithScript`). Under load many jobs finish at nearly the same moment: the
`Coalescer` sends theirs as one transaction (group commit, as databases do for their log). No
library does this for redis-py, hence ours.

It adds no timer: a transaction goes out at the next turn of the event loop if nothing is in flight,
else as soon as the one in flight is answered, together with every other that came meanwhile. The
wait it adds is at most that one answer (one round trip plus the Redis time of the batch ahead).
Each job's commands keep their order and stay inside one MULTI/EXEC: atomic with each other, as
before, now with the other jobs' too. A job's own replies (and errors) are handed back to it alone;
a failure of the whole send (Redis unreachable) is every member's, and each retries as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from arq.connections import ArqRedis
from arq.constants import abort_jobs_ss
from redis.asyncio.client import Pipeline

from agent_async.engine.claim import PickedUp
from agent_async.engine.wakeup import queue_wake
from agent_async.errors import AgentError
from agent_async.store import ScriptCall

__all__ = ["Coalescer", "CoalescerStats", "PoolWithPickup", "PoolWithScript"]

# Jobs per MULTI/EXEC at most: Redis runs a transaction without serving anyone else, and a job's
# scripts cost it about 70 µs, so a batch stays near a few ms however many slots a worker has.
MAX_BATCH = 32

# What arq's run_job stages first: GET the job, INCR (redis-py's INCRBY 1) and EXPIRE its tries,
# then ZREM it from the abort set if aborts are on.
_ARQ_PICKUP = ["GET", "INCRBY", "EXPIRE"]

# (args, options) as redis-py stages a command on a pipeline.
Command = tuple[tuple[str | bytes, ...], Mapping[str, Any]]


@dataclass(slots=True)
class CoalescerStats:
    """What the coalescer sent: transactions of jobs, and MULTI/EXECs they went out in."""

    transactions: int = 0
    sends: int = 0
    largest: int = 0
    # Longest time a transaction waited for its send to start (the send ahead of it), in ms.
    longest_wait_ms: float = 0.0


@dataclass(eq=False, slots=True)
class _Member:
    commands: list[Command]
    at_s: float = field(default_factory=lambda: asyncio.get_running_loop().time())
    reply: asyncio.Future[list[Any]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class _CoalescedPipeline(Pipeline):
    """A transactional pipeline that stages its commands as redis-py does, and on execute hands
    them to the coalescer instead of sending them itself."""

    def __init__(self, pool: ArqRedis, coalescer: Coalescer) -> None:
        super().__init__(pool.connection_pool, pool.response_callbacks, True, None)
        self._coalescer = coalescer

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        commands, self.command_stack = self.command_stack, []
        if not commands:
            return []
        replies = await self._coalescer.send(commands)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies


class Coalescer:
    """Transactions of several jobs, sent as one MULTI/EXEC (see the module's docstring)."""

    def __init__(self, pool: Callable[[], ArqRedis], *, aborts: bool = True) -> None:
        # A getter: arq makes its pool when the worker starts (and again after a restart).
        self._pool = pool
        # arq's finish ZREMs the job from its abort set whether aborts are on or not; with them off
        # nothing reads the set (and our cancel never writes it): that call is dropped, one per job.
        self._abort_set = None if aborts else abort_jobs_ss.encode()
        self._waiting: list[_Member] = []
        self._sender: asyncio.Task[None] | None = None
        self.stats = CoalescerStats()

    def pipeline(self) -> Pipeline:
        return _CoalescedPipeline(self._pool(), self)

    async def send(self, commands: list[Command]) -> list[Any]:
        """Send one job's transaction with whatever others are ready; its replies, in order (but
        none for an abort-set ZREM dropped with aborts off)."""
        if self._abort_set is not None:
            commands = [c for c in commands if not _touches(c, "ZREM", self._abort_set)]
        member = _Member(commands)
        self._waiting.append(member)
        if self._sender is None:
            # Started, not run: transactions opened in this same turn of the loop join it.
            self._sender = asyncio.get_running_loop().create_task(self._send_waiting())
        return await member.reply

    async def _send_waiting(self) -> None:
        try:
            while self._waiting:
                batch = [member for member in self._waiting[:MAX_BATCH] if not member.reply.done()]
                del self._waiting[:MAX_BATCH]
                if batch:
                    await self._send_batch(batch)
        finally:
            self._sender = None
            for member in self._waiting:  # only if this task was cancelled (the loop is closing)
                member.reply.cancel()
            self._waiting.clear()

    async def _send_batch(self, batch: list[_Member]) -> None:
        waited_ms = (asyncio.get_running_loop().time() - batch[0].at_s) * 1000
        try:
            pipe = self._pool().pipeline(transaction=True)
            for member in batch:
                pipe.command_stack.extend(member.commands)
            replies = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for member in batch:
                member.reply.cancel()
            raise
        except Exception as exc:
            for member in batch:
                if not member.reply.done():
                    member.reply.set_exception(exc)
            return
        self.stats.transactions += len(batch)
        self.stats.sends += 1
        self.stats.largest = max(self.stats.largest, len(batch))
        self.stats.longest_wait_ms = max(self.stats.longest_wait_ms, waited_ms)
        first = 0
        for member in batch:
            last = first + len(member.commands)
            if not member.reply.done():  # its job was cancelled meanwhile: its commands went anyway
                member.reply.set_result(replies[first:last])
            first = last


def _touches(command: Command, name: str, key: bytes) -> bool:
    args = command[0]
    if len(args) < 2 or str(args[0]).upper() != name:
        return False
    first = args[1]
    return (first if isinstance(first, bytes) else str(first).encode()) == key


class PoolWithScript:
    """arq's pool, except that each transactional pipeline starts with one of our scripts (and,
    for a finish that queues the job again, a wake-up token)."""

    def __init__(
        self, pool: ArqRedis, call: ScriptCall | None, wake_key: str | None = None,
        coalescer: Coalescer | None = None,
    ) -> None:
        self._pool = pool
        self._call = call
        self._wake_key = wake_key
        self._coalescer = coalescer

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        if transaction and self._coalescer is not None:
            pipe = self._coalescer.pipeline()
        else:
            pipe = self._pool.pipeline(transaction=transaction, shard_hint=shard_hint)
        if self._call is not None:
            self._call.queue_on(pipe)
        if self._wake_key is not None:
            queue_wake(pipe, self._wake_key)
        return pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class _AnsweredPickup:
    """arq's pickup transaction of a job the claim already picked up: arq stages its commands, and
    gets the replies the claim had for them, without a round trip."""

    def __init__(self, pipe: Pipeline, picked: PickedUp) -> None:
        self._pipe = pipe
        self._picked = picked

    async def __aenter__(self) -> _AnsweredPickup:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._pipe.reset()  # type: ignore[no-untyped-call]

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        staged = [str(args[0]).upper() for args, _ in self._pipe.command_stack]
        if staged not in (_ARQ_PICKUP, [*_ARQ_PICKUP, "ZREM"]):
            # arq is pinned to 0.28.*: this is a newer arq whose pickup the claim does not match.
            raise AgentError(f"arq's pickup transaction is not what the claim did for it: {staged}")
        self._picked.answered = True
        replies = [self._picked.job, self._picked.tries, True, self._picked.aborted]
        return replies[:len(staged)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


class PoolWithPickup:
    """arq's pool, whose next pipeline is the pickup the claim already did (see pickup.lua)."""

    def __init__(self, pool: ArqRedis, picked: PickedUp) -> None:
        self._pool = pool
        self._picked = picked

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> _AnsweredPickup:
        return _AnsweredPickup(self._pool.pipeline(transaction=transaction, shard_hint=shard_hint), self._picked)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)
