"""arq's per-job transactions off the fast worker's direct path: the pickup answered from the
claim, and our outcome inside arq's finish.

arq opens one transaction to pick a job up (GET job, INCR tries) and one to finish it (delete its
keys, store its result). The fast worker's claim already did the pickup (pickup.lua, with the START
transition): arq's pickup is answered from the claim's reply (`PoolWithPickup`). When arq's own
run_job finishes a job (a job off the direct path, engine/direct.py), the outcome goes in front of
arq's finish (`PoolWithScript`): one atomic write. The runs the worker ran itself are finished
together instead (engine/finish.py).
"""

from __future__ import annotations

from typing import Any

from arq.connections import ArqRedis
from redis.asyncio.client import Pipeline

from agent_async.engine.claim import PickedUp
from agent_async.engine.wakeup import queue_wake
from agent_async.errors import AgentError
from agent_async.store import ScriptCall

__all__ = ["PoolWithPickup", "PoolWithScript"]

# What arq's run_job stages first: GET the job, INCR (redis-py's INCRBY 1) and EXPIRE its tries,
# then ZREM it from the abort set if aborts are on.
_ARQ_PICKUP = ["GET", "INCRBY", "EXPIRE"]


class PoolWithScript:
    """arq's pool, except that each transactional pipeline starts with one of our scripts (and,
    for a finish that queues the job again, a wake-up token)."""

    def __init__(self, pool: ArqRedis, call: ScriptCall | None, wake_key: str | None = None) -> None:
        self._pool = pool
        self._call = call
        self._wake_key = wake_key

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
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
