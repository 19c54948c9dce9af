"""Concurrent callers' commands share round trips: state reads under load (`JobStore.get`).

redis-py (5.x, the line arq allows) spends about 60 µs of client CPU on a command it sends alone:
a pool checkout under a lock, a probe of the socket, a send and a receive system call, and under
load the callers queue on that lock. Thirty commands in one pipeline cost about what five do
alone. `AutoPipeline` sends a command at once when none of its own is in flight, as before; a
command that comes while one is in flight waits for it, then goes out in one pipeline (not a
MULTI: each command, each script, stays atomic on its own, as when sent alone) with every other
that came meanwhile, in the order they came. There is no timer: the wait it adds is at most the
answer to the send ahead of it (one round trip). redis-py has no auto-pipelining, hence ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

__all__ = ["MAX_BATCH", "AutoPipeline", "PipelineStats"]

# Commands per pipeline at most: Redis runs a client's pipelined commands back to back, so a batch
# stays short for the other clients.
MAX_BATCH = 32

_Waiting = tuple[tuple[Any, ...], "asyncio.Future[Any]"]


@dataclass(slots=True)
class PipelineStats:
    """Commands asked for, and the round trips they went out in."""

    commands: int = 0
    sends: int = 0
    largest: int = 0


class AutoPipeline:
    """Commands of concurrent callers, sent together (see the module's docstring)."""

    def __init__(self, redis: Callable[[], Redis]) -> None:
        # A getter: the store is bound to its client after it is built (and rebound after a restart).
        self._redis = redis
        self._busy = False
        self._waiting: list[_Waiting] = []
        # Held so the task is not collected while it runs (the loop keeps only a weak reference).
        self._sender: asyncio.Task[None] | None = None
        self.stats = PipelineStats()

    async def execute_command(self, *args: Any) -> Any:
        """One command's reply, parsed as redis-py parses it (HGETALL: a dict); its error raised."""
        self.stats.commands += 1
        if not self._busy:
            self._busy = True
            self.stats.sends += 1
            self.stats.largest = max(self.stats.largest, 1)
            try:
                return await self._redis().execute_command(*args)  # type: ignore[no-untyped-call]
            finally:
                self._next()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((args, future))
        return await future

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        reply: dict[bytes, bytes] = await self.execute_command("HGETALL", key)
        return reply

    def _next(self) -> None:
        """The send in flight is answered (or failed, or its caller gave up): send what waits."""
        if self._waiting:
            self._sender = asyncio.get_running_loop().create_task(self._send_waiting())
        else:
            self._busy = False

    async def _send_waiting(self) -> None:
        try:
            while self._waiting:
                batch = [(args, future) for args, future in self._waiting[:MAX_BATCH] if not future.done()]
                del self._waiting[:MAX_BATCH]
                if batch:
                    await self._send(batch)
        finally:
            self._busy = False
            self._sender = None
            for _, future in self._waiting:  # only if this task was cancelled (the loop is closing)
                future.cancel()
            self._waiting.clear()

    async def _send(self, batch: list[_Waiting]) -> None:
        self.stats.sends += 1
        self.stats.largest = max(self.stats.largest, len(batch))
        try:
            async with self._redis().pipeline(transaction=False) as pipe:
                for args, _ in batch:
                    pipe.execute_command(*args)
                replies = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            # The whole send failed (Redis unreachable): it is every caller's error.
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its caller gave up waiting
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)
