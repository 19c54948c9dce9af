"""arq's Worker that stops cleanly (a stop signal is a normal end; a close with Redis down still
runs on_shutdown), and the two loops that run a worker: arq's own, and one that outlives Redis errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from signal import Signals
from typing import Any

from arq.worker import Worker
from redis.exceptions import RedisError

from agent_async.engine.wakeup import wait_set
from agent_async.outage import OUTAGE_ERRORS, RedisOutage

__all__ = ["StoppableWorker", "run_stopping_on_signal", "run_surviving_redis"]

logger = logging.getLogger(__name__)

# Backoff of the worker loop's restarts after Redis errors: short, since a retry while Redis is down
# costs one failed connect, and a long pause would outlast a short outage by seconds.
_REDIS_RETRY_MIN_S = 0.5
_REDIS_RETRY_MAX_S = 2.0


class StoppableWorker(Worker):
    """arq's Worker that remembers a stop signal, so the loop around it ends instead of retrying,
    and that closes cleanly when Redis is unreachable at shutdown."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stopping = asyncio.Event()

    def handle_sig_wait_for_completion(self, signum: Signals) -> None:
        self.stopping.set()
        super().handle_sig_wait_for_completion(signum)

    def handle_sig(self, signum: Signals) -> None:
        if signum != signal.SIGUSR1:  # arq's close() sends itself SIGUSR1 to cancel what runs
            self.stopping.set()
        super().handle_sig(signum)

    async def close(self) -> None:
        if not self._handle_signals:
            self.handle_sig(signal.SIGUSR1)  # how arq's close() starts without signals: cancel what runs
        # arq's close() gathers its job tasks and lets the first error out, cutting the wait short:
        # on_shutdown would interrupt jobs about to end, or be skipped (a task cancelled before it
        # began raises CancelledError). Wait for all of them first (a failed one is settled by
        # the reconciler).
        for error in await asyncio.gather(*self.tasks.values(), return_exceptions=True):
            if isinstance(error, Exception):
                logger.warning("a job task ended with an error while the worker closed: %r", error)
        self.tasks.clear()
        try:
            await super().close()
        except OUTAGE_ERRORS as exc:
            # arq's close() deletes its health-check key first: with Redis down it would raise
            # before running on_shutdown and closing its pool.
            logger.warning("worker closing while Redis is unreachable (%s)", exc)
            if self.on_shutdown:
                await self.on_shutdown(self.ctx)
            with contextlib.suppress(*OUTAGE_ERRORS):
                await self.pool.close(close_connection_pool=True)
            self._pool = None


async def run_stopping_on_signal(worker: StoppableWorker) -> None:
    """arq's own loop, as its CLI runs it (a Redis error ends it, arq #498); a stop signal is a
    normal end, not a CancelledError."""
    try:
        await worker.main()
    except asyncio.CancelledError:
        if not worker.stopping.is_set():
            raise


async def run_surviving_redis(worker: StoppableWorker, outage: RedisOutage) -> None:
    """arq's poll loop ends on the first Redis error (arq #498): restart it with backoff, until a
    stop signal (which also ends the wait for Redis at once)."""
    delay_s = _REDIS_RETRY_MIN_S
    while not worker.stopping.is_set():
        started = time.monotonic()
        try:
            await worker.async_run()
            return
        except asyncio.CancelledError:
            if worker.stopping.is_set():
                return  # arq's signal handler drained and cancelled its loop: a normal end
            raise
        except (RedisError, OSError) as exc:
            if time.monotonic() - started > _REDIS_RETRY_MAX_S:
                delay_s = _REDIS_RETRY_MIN_S  # it had been running fine: start the backoff over
            if isinstance(exc, OUTAGE_ERRORS):
                outage.failed("worker loop", exc)
            else:
                logger.warning("Redis error in the worker loop (%s); retrying in %.1fs", exc, delay_s)
            await wait_set(worker.stopping, delay_s)
            delay_s = min(_REDIS_RETRY_MAX_S, delay_s * 2)
