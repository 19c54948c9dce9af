"""Progress from a running job: `await report_progress(0.4, "page 4 of 10", pages=4)` in process().

Rate-limited per attempt: at most one write every MIN_INTERVAL_S; a report in between replaces
the pending one, which is written when the interval is over (or when the attempt ends), so a
tight loop costs a few writes per second and the last value is never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agent_async.errors import AgentError
from agent_async.store import codec
from agent_async.worker.child import current_run

__all__ = ["MIN_INTERVAL_S", "ProgressReporter", "report_progress"]

logger = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.25

ProgressWrite = Callable[[float, str | None, dict[str, Any]], Awaitable[bool]]


class ProgressReporter:
    """One attempt's progress, coalesced; `close()` writes what is pending (before the outcome)."""

    def __init__(self, write: ProgressWrite, *, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self._write = write
        self._min_interval_s = min_interval_s
        self._last_write = -math.inf
        self._pending: tuple[float, str | None, dict[str, Any]] | None = None
        self._flush: asyncio.Task[None] | None = None

    async def report(self, fraction: float, message: str | None, details: dict[str, Any]) -> None:
        wait_s = self._last_write + self._min_interval_s - time.monotonic()
        if wait_s <= 0 and self._flush is None:
            await self._send(fraction, message, details)
            return
        self._pending = (fraction, message, details)
        if self._flush is None:
            self._flush = asyncio.create_task(self._flush_after(max(0.0, wait_s)))

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flush
            self._flush = None
        if self._pending is not None:
            pending, self._pending = self._pending, None
            await self._send(*pending)

    async def _flush_after(self, wait_s: float) -> None:
        await asyncio.sleep(wait_s)
        self._flush = None
        if self._pending is not None:
            pending, self._pending = self._pending, None
            await self._send(*pending)

    async def _send(self, fraction: float, message: str | None, details: dict[str, Any]) -> None:
        self._last_write = time.monotonic()
        try:
            await self._write(fraction, message, details)
        except Exception as exc:
            # Progress is informative: it never fails the job (an outage is reported elsewhere).
            logger.warning("progress not recorded (%s: %s)", type(exc).__name__, exc)


async def report_progress(fraction: float, message: str | None = None, **details: Any) -> None:
    """Record how far the running job is (0.0 to 1.0), with an optional message and JSON details:
    stored in its JobState (the public view shows it) and announced on the event stream."""
    if not (isinstance(fraction, (int, float)) and 0.0 <= fraction <= 1.0):
        raise ValueError(f"progress must be a number from 0 to 1, not {fraction!r}")
    codec.check_json_safe(details, "details")
    handle = current_run.get()
    if handle is None or handle.progress is None:
        raise AgentError("report_progress() is for code running inside Job.process() in a worker")
    await handle.progress.report(float(fraction), message, details)
