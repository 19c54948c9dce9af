"""Group commit: what concurrent callers ask for at about the same time goes out in one send.

As databases do for their log: an item goes out at the next turn of the event loop if no send is
in flight, else as soon as the one in flight is answered, with every other that came meanwhile, at
most `max_batch` per send. There is no timer: the wait it adds is at most the send ahead of it,
unless a `linger` lets a send wait a bounded time for more items (the fast worker's finishes, when
AGENT_WORKER_FINISH_LINGER_MS is set: fewer, bigger calls).
Each item's result (or error) is its own; a failure of the whole send is every item's. The store's
enqueues (store/enqueue.py) and the fast worker's finishes (engine/finish.py) go out this way, one
script call per send. No library does this for redis-py scripts, hence ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["GroupCommit", "GroupStats"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class GroupStats:
    """Items sent, the sends they went out in, and the longest wait of an item for its send (ms)."""

    items: int = 0
    sends: int = 0
    largest: int = 0
    longest_wait_ms: float = 0.0


@dataclass(eq=False, slots=True)
class _Waiting(Generic[T, R]):
    item: T
    at_s: float = field(default_factory=lambda: asyncio.get_running_loop().time())
    reply: asyncio.Future[R] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class GroupCommit(Generic[T, R]):
    """Items sent together by `send`, which answers each one in order: its result, or an exception
    that is raised to its caller alone. `together=False` sends each item alone. `linger(n)`, with n
    items waiting, says how long after the oldest of them came a send may still wait for more (0:
    send now); it is asked again as each item comes."""

    def __init__(
        self, send: Callable[[list[T]], Awaitable[Sequence[R | BaseException]]], *, max_batch: int,
        together: bool = True, linger: Callable[[int], float] | None = None,
    ) -> None:
        self._send_items = send
        self._max_batch = max_batch
        self._together = together
        self._linger = linger
        # Set by each item that comes while a send lingers (_gather).
        self._arrived: asyncio.Event | None = None
        self._waiting: list[_Waiting[T, R]] = []
        # Held so the task is not collected while it runs (the loop keeps only a weak reference).
        self._sender: asyncio.Task[None] | None = None
        self.stats = GroupStats()

    async def submit(self, item: T) -> R:
        """Send one item (with whatever others are ready) and return its result."""
        waiting: _Waiting[T, R] = _Waiting(item)
        if not self._together:
            await self._send([waiting])
        else:
            self._waiting.append(waiting)
            if self._arrived is not None:
                self._arrived.set()
            if self._sender is None:
                # Started, not run: items that come in this same turn of the loop join it.
                self._sender = asyncio.get_running_loop().create_task(self._send_waiting())
        return await waiting.reply

    async def _send_waiting(self) -> None:
        try:
            while self._waiting:
                if self._linger is not None:
                    await self._gather(self._linger)
                batch = [w for w in self._waiting[:self._max_batch] if not w.reply.done()]
                del self._waiting[:self._max_batch]
                if batch:
                    await self._send(batch)
        finally:
            self._sender = None
            for waiting in self._waiting:  # only if this task was cancelled (the loop is closing)
                waiting.reply.cancel()
            self._waiting.clear()

    async def _gather(self, linger: Callable[[int], float]) -> None:
        """Wait for more items while `linger` lets the oldest waiting one wait, and the batch is not full."""
        loop = asyncio.get_running_loop()
        while len(self._waiting) < self._max_batch:
            left_s = self._waiting[0].at_s + linger(len(self._waiting)) - loop.time()
            if left_s <= 0:
                return
            self._arrived = arrived = asyncio.Event()
            try:
                # Not wait_for: on Python 3.11 it swallows a cancel that lands as the event is set.
                async with asyncio.timeout(left_s):
                    await arrived.wait()
            except TimeoutError:
                return
            finally:
                self._arrived = None

    async def _send(self, batch: list[_Waiting[T, R]]) -> None:
        waited_ms = (asyncio.get_running_loop().time() - batch[0].at_s) * 1000
        try:
            results = await self._send_items([w.item for w in batch])
        except asyncio.CancelledError:
            for waiting in batch:
                waiting.reply.cancel()
            raise
        except Exception as exc:
            for waiting in batch:
                if not waiting.reply.done():
                    waiting.reply.set_exception(exc)
            return
        stats = self.stats
        stats.items += len(batch)
        stats.sends += 1
        stats.largest = max(stats.largest, len(batch))
        stats.longest_wait_ms = max(stats.longest_wait_ms, waited_ms)
        for waiting, result in zip(batch, results, strict=True):
            if waiting.reply.done():  # its caller gave up waiting: its item went anyway
                continue
            if isinstance(result, BaseException):
                waiting.reply.set_exception(result)
            else:
                waiting.reply.set_result(result)
