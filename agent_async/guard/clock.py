"""Redis's clock mapped onto this process's monotonic clock (the guard wakes paced callers with it)."""

from __future__ import annotations

import math
import time

__all__ = ["SlotClock"]

# How long one estimate of Redis's clock on ours is trusted before it is taken afresh (bounds drift).
_CLOCK_WINDOW_S = 10.0


class SlotClock:
    """Redis's clock mapped onto this process's monotonic clock, to wake paced callers on their slot.

    A reply reaches its caller some delay after the script read TIME; sleeping the script's wait
    from then makes each caller late by its own delay, and in a burst the loop hands replies out
    milliseconds apart. The smallest (receipt - Redis time) seen is the mapping with the least
    delay in it: since no delay is negative, waking at slot + that offset is never early. Taken
    afresh every _CLOCK_WINDOW_S (a later estimate only wakes callers later), so drift stays small.
    """

    __slots__ = ("_offset_s", "_since")

    def __init__(self) -> None:
        self._offset_s = math.inf
        self._since = -math.inf

    def observe(self, redis_now_us: int, received: float) -> None:
        """A reply computed at `redis_now_us` (Redis's clock) arrived at `received` (time.monotonic())."""
        offset_s = received - redis_now_us / 1_000_000
        if offset_s < self._offset_s or received - self._since > _CLOCK_WINDOW_S:
            self._offset_s, self._since = offset_s, received

    def wait_s(self, slot_us: int) -> float:
        return max(0.0, slot_us / 1_000_000 + self._offset_s - time.monotonic())


