"""RedisOutage: one warning when Redis goes away, a summary while it stays away, one line when it is back.

Every background loop of a worker (poll loop, heartbeat, cancel listener, outcome writes) meets
the same outage at once; each reports here instead of logging its own traceback every second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

__all__ = ["OUTAGE_ERRORS", "RedisOutage"]

# What "Redis is unreachable" looks like: refused or dropped connections, timeouts, a Redis still
# loading its data after a restart. Any other error is a bug and is logged as one.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, BusyLoadingError, OSError)

logger = logging.getLogger("agent_async.redis")

# While Redis stays unreachable, one summary line this often.
_SUMMARY_EVERY_S = 10.0


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


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
