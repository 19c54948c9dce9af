"""Concurrent reads of job states share their round trips (`GET /jobs/<id>` under load, pollers).

redis-py spends about 60 µs of client CPU on a command it sends alone: a pool checkout under a
lock, a probe of the socket, a send and a receive system call. Thirty reads sent in one pipeline
cost about what five do alone. `SharedReads` sends a read at once when none is in flight, as
before; a read that comes while one is in flight waits for it, then goes out in one pipeline with
every other that came meanwhile. There is no timer: the wait it adds is at most the answer to the
read ahead of it (one round trip). redis-py has no auto-pipelining, hence ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis

__all__ = ["ReadStats", "SharedReads"]

# Reads per pipeline at most: Redis answers a pipeline's commands without serving anyone else in
# between, and a state's HGETALL costs it a few µs, so a batch stays well under a millisecond.
MAX_BATCH = 64

_Waiting = tuple[str, "asyncio.Future[dict[bytes, bytes]]"]


@dataclass(slots=True)
class ReadStats:
    """Reads asked for, and the round trips they went out in."""

    reads: int = 0
    sends: int = 0
    largest: int = 0


class SharedReads:
    """HGETALLs of concurrent callers, sent together (see the module's docstring)."""

    def __init__(self, redis: Callable[[], Redis]) -> None:
        # A getter: the store is bound to its client after it is built (and rebound after a restart).
        self._redis = redis
        self._busy = False
        self._waiting: list[_Waiting] = []
        # Held so the task is not collected while it runs (the loop keeps only a weak reference).
        self._sender: asyncio.Task[None] | None = None
        self.stats = ReadStats()

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        self.stats.reads += 1
        if not self._busy:
            self._busy = True
            self.stats.sends += 1
            self.stats.largest = max(self.stats.largest, 1)
            try:
                return await self._redis().hgetall(key)  # type: ignore[misc,no-any-return]
            finally:
                self._next()
        future: asyncio.Future[dict[bytes, bytes]] = asyncio.get_running_loop().create_future()
        self._waiting.append((key, future))
        return await future

    def _next(self) -> None:
        """The read in flight is answered (or failed, or its caller gave up): send what waits."""
        if self._waiting:
            self._sender = asyncio.get_running_loop().create_task(self._send_waiting())
        else:
            self._busy = False

    async def _send_waiting(self) -> None:
        try:
            while self._waiting:
                batch = [(key, future) for key, future in self._waiting[:MAX_BATCH] if not future.done()]
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
                for key, _ in batch:
                    pipe.hgetall(key)
                replies = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            # The whole send failed (Redis unreachable): it is every reader's error.
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
