"""RedisOutage: one warning when Redis goes away, a summary while it stays away, one line when it is back.

Every background loop of a worker (poll loop, heartbeat, cancel listener, outcome writes) meets
the same outage at once; each reports here instead of logging its own traceback every second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

__all__ = ["OUTAGE_ERRORS", "RedisOutage", "send_through_outage"]

T = TypeVar("T")

# What "Redis is unreachable" looks like: refused or dropped connections, timeouts, a Redis still
# loading its data after a restart. Any other error is a bug and is logged as one.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, BusyLoadingError, OSError)

logger = logging.getLogger("agent_async.redis")

# While Redis stays unreachable, one summary line this often.
_SUMMARY_EVERY_S = 10.0
# The pause between two sends of a write through an outage: doubled from the first to the last.
_RESEND_PAUSE_MIN_S = 0.05
_RESEND_PAUSE_MAX_S = 1.0


class RedisOutage:
    """Shared by the loops of one process; not thread-safe (one event loop)."""

    def __init__(self, *, summary_every_s: float = _SUMMARY_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self._summary_every_s = summary_every_s
        self._clock = clock
        self._since: float | None = None
        self._failures = 0
        self._last_summary = 0.0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, where: str, exc: BaseException) -> None:
        """A Redis call failed with one of OUTAGE_ERRORS."""
        now = self._clock()
        self._failures += 1
        if self._since is None:
            self._since = self._last_summary = now
            logger.warning("Redis is unreachable (%s: %s); retrying", where, _describe(exc))
        elif now - self._last_summary >= self._summary_every_s:
            self._last_summary = now
            logger.warning("Redis still unreachable after %.0fs (%d failed calls)", now - self._since, self._failures)

    def ok(self) -> None:
        """A Redis call succeeded: ends the outage, if there was one."""
        if self._since is None:
            return
        down_s = self._clock() - self._since
        logger.info("Redis is reachable again after %.1fs (%d failed calls)", down_s, self._failures)
        self._since = None
        self._failures = 0


async def send_through_outage(
    send: Callable[[bool], Awaitable[T]],
    *,
    for_s: float,
    errors: tuple[type[BaseException], ...] = OUTAGE_ERRORS,
    failed: Callable[[BaseException], None] | None = None,
) -> T:
    """`send(resent)`, sent again with backoff while it fails with one of `errors`, for up to `for_s`
    seconds; then that last error is raised (any other error at once). `resent` is False for the
    first send only: a send that failed may still have run in Redis (its reply was lost), and the
    write sent after it must be able to tell (each writer says how: its own start time, its mark,
    the id it drew). `failed` hears of each failure (RedisOutage.failed, for the logs)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + for_s
    pause_s = _RESEND_PAUSE_MIN_S
    resent = False
    while True:
        try:
            return await send(resent)
        except errors as exc:
            if failed is not None:
                failed(exc)
            if loop.time() + pause_s > deadline:
                raise
        resent = True
        await asyncio.sleep(pause_s)
        pause_s = min(_RESEND_PAUSE_MAX_S, pause_s * 2)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
