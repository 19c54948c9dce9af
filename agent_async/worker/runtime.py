"""WorkerRuntime: what a worker process runs beside the engine: leases, cancel requests, recovery."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from agent_async.outage import OUTAGE_ERRORS, RedisOutage
from agent_async.store import JobStore
from agent_async.store.workers import WorkerDirectory
from agent_async.worker.child import RunHandle
from agent_async.worker.recovery import JobRecovery

__all__ = ["WorkerRuntime"]

logger = logging.getLogger(__name__)

# Waiting for a cancel message blocks at most this long, so a dead subscription is noticed.
_LISTEN_TIMEOUT_S = 1.0
# Pause before retrying a background loop that hit an error (Redis down, typically).
_ERROR_PAUSE_S = 1.0
# A periodic recovery pass keeps the namespace's recovery lock for this share of the interval: a
# worker's next pass (an interval after its last one ended) finds it free, another worker's in
# between does not. The margin covers timers that fire a little early.
_HOLD_SHARE = 0.9
# The sweeps run after every this many passes a worker makes (the first one included): their
# work (blobs of ended jobs, finalizers whose queueing failed) can wait a few intervals, and each
# costs Redis a read whether there is anything to sweep or not.
SWEEP_EVERY_PASSES = 3


class WorkerRuntime:
    """Tracks the attempts running in this process and keeps three loops going:

    - heartbeat: renews the leases of running jobs every third of the lease, and picks up cancel
      requests (the fallback for a missed pub/sub message);
    - cancel listener: a pub/sub subscription that stops a job within milliseconds of a cancel;
    - recovery: JobRecovery at start-up, then every reconcile interval, under the recovery lock
      (which a periodic pass keeps for most of the interval: one pass per interval per namespace).
    """

    def __init__(
        self,
        store: JobStore,
        *,
        recovery: JobRecovery,
        lease_s: float,
        reconcile_interval_s: float,
        outage: RedisOutage | None = None,
        heartbeat_file: Path | None = None,
        sweeps: Sequence[Callable[[], Awaitable[int]]] = (),
        directory: WorkerDirectory | None = None,
        sweep_every_passes: int = SWEEP_EVERY_PASSES,
    ) -> None:
        self._store = store
        self._directory = directory
        # Run after the recovery passes this worker makes (OwnedBlobs.sweep, for one): like the
        # pass, by one worker of the namespace at a time; after every `sweep_every_passes` of them.
        self._sweeps = list(sweeps)
        self._sweep_every_passes = sweep_every_passes
        self._passes = 0
        self._heartbeat_file = heartbeat_file
        self._outage = outage or RedisOutage()
        self.recovery = recovery
        self._lease_s = lease_s
        self._reconcile_interval_s = reconcile_interval_s
        self.running: dict[str, RunHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def track(self, job_id: str) -> RunHandle:
        handle = RunHandle(job_id)
        self.running[job_id] = handle
        return handle

    def untrack(self, job_id: str) -> None:
        self.running.pop(job_id, None)

    def release_ended(self, job_id: str) -> None:
        """Stop tracking the job's attempt if it has ended. A newer attempt of the same job (its
        retry, claimed as soon as the last attempt's finish let it go, maybe before this call)
        stays tracked: its lease and its cancel requests are its own."""
        handle = self.running.get(job_id)
        if handle is not None and handle.ended:
            del self.running[job_id]

    def request_cancel(self, job_id: str) -> bool:
        handle = self.running.get(job_id)
        if handle is None:
            return False
        handle.request_cancel()
        return True

    async def start(self) -> None:
        try:
            settled = await self.recovery.reconcile_orphans()
            if settled:
                logger.warning("start-up recovery settled %d orphaned job(s)", settled)
        except OUTAGE_ERRORS as exc:
            self._outage.failed("start-up recovery", exc)
        except Exception:
            logger.exception("start-up recovery failed; the periodic pass will retry")
        self._touch_heartbeat_file()
        if self._directory is not None:
            try:
                await self._directory.beat(0)
            except OUTAGE_ERRORS as exc:
                self._outage.failed("worker registration", exc)
        # The heartbeat may have nothing to send (no job running): only the recovery pass, which
        # always takes its lock in Redis, may say that Redis is back.
        self._spawn(self._every(self._lease_s / 3, self._heartbeat, proves_redis=False))
        self._spawn(self._listen_for_cancels())
        self._spawn(self._every(self._reconcile_interval_s, self._reconcile))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._directory is not None:
            try:
                await self._directory.leave()
            except OUTAGE_ERRORS as exc:
                logger.warning("could not unregister this worker (%s); its entry expires by itself", exc)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _every(
        self, interval_s: float, step: Callable[[], Awaitable[None]], *, proves_redis: bool = True
    ) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await step()
            except OUTAGE_ERRORS as exc:
                self._outage.failed(step.__name__.lstrip("_"), exc)
            except Exception:
                logger.exception("worker background step %s failed; retrying", step.__name__)
            else:
                if proves_redis:
                    self._outage.ok()

    async def _heartbeat(self) -> None:
        self._touch_heartbeat_file()
        if self._directory is not None:
            await self._directory.beat(len(self.running))
        flagged = await self._store.renew_leases(list(self.running))
        for job_id in flagged:
            self.request_cancel(job_id)

    def _touch_heartbeat_file(self) -> None:
        """This process's loop is alive: Docker's health check reads the file's age."""
        if self._heartbeat_file is None:
            return
        try:
            self._heartbeat_file.touch()
        except OSError as exc:
            logger.warning("cannot touch the heartbeat file %s: %s", self._heartbeat_file, exc)

    async def _reconcile(self) -> None:
        hold_s = self._reconcile_interval_s * _HOLD_SHARE
        if await self.recovery.reconcile_orphans(lock_ttl_s=hold_s, hold=True) is None:
            return  # another worker holds the pass, and sweeps after it: each sweep is namespace-wide
        self._passes += 1
        if (self._passes - 1) % self._sweep_every_passes == 0:
            for sweep in self._sweeps:
                await sweep()

    async def _listen_for_cancels(self) -> None:
        channel = self._store.keys.cancel_channel
        while True:
            pubsub = self._store.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
                self._outage.ok()
                while True:
                    message = await pubsub.get_message(timeout=_LISTEN_TIMEOUT_S)
                    if message is not None:
                        self.request_cancel(message["data"].decode())
            except asyncio.CancelledError:
                raise
            except OUTAGE_ERRORS as exc:
                self._outage.failed("cancel subscription", exc)
                await asyncio.sleep(_ERROR_PAUSE_S)
            except Exception:
                logger.warning("cancel subscription lost; resubscribing", exc_info=True)
                await asyncio.sleep(_ERROR_PAUSE_S)
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
