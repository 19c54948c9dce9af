"""WorkerService: the worker side of one process, called by the engine's hooks (its JobHandler)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from agent_async.engine import Engine
from agent_async.errors import AgentError
from agent_async.job import JobResources
from agent_async.lifecycle import Outcome, StartDecision
from agent_async.logs import silence_engine_job_lines
from agent_async.outage import RedisOutage
from agent_async.registry import JobRegistry
from agent_async.settings import AgentSettings
from agent_async.store import JobStore
from agent_async.store.events import EventLog
from agent_async.store.workers import WorkerDirectory
from agent_async.worker.child import RunHandle
from agent_async.worker.progress import ProgressReporter
from agent_async.worker.recovery import JobRecovery
from agent_async.worker.runner import Backoff, JobContextFactory, JobRunner, StopPolicy
from agent_async.worker.runtime import WorkerRuntime

__all__ = ["WorkerService"]

logger = logging.getLogger(__name__)

# Active jobs looked at per recovery pass (besides every run whose lease ran out).
_RECOVERY_PAGE = 500

ProcessHook = Callable[[], Awaitable[None]]


class WorkerService:
    """Builds one JobRunner per job name, tracks the attempts running here, and runs the
    WorkerRuntime (leases, cancels, recovery) from the worker's start-up to its shutdown."""

    def __init__(
        self,
        store: JobStore,
        *,
        engine: Engine,
        registry: JobRegistry,
        settings: AgentSettings,
        resources: JobResources,
        job_context: JobContextFactory | None = None,
        on_startup: Sequence[ProcessHook] = (),
        on_shutdown: Sequence[ProcessHook] = (),
        outage: RedisOutage | None = None,
        sweeps: Sequence[Callable[[], Awaitable[int]]] = (),
        events: EventLog | None = None,
    ) -> None:
        self._store = store
        self._events = events
        self._sweeps = list(sweeps)
        self._outage = outage or RedisOutage()
        self._engine = engine
        self._registry = registry
        self._settings = settings
        self._resources = resources
        self._job_context = job_context
        self._on_startup = list(on_startup)
        self._on_shutdown = list(on_shutdown)
        self._backoff = Backoff(settings.retry_backoff_base_s, settings.retry_backoff_max_s)
        self._stop = StopPolicy(settings.hard_timeout_grace_s, settings.cancel_grace_s)
        self._runners: dict[str, JobRunner] = {}
        self.runtime: WorkerRuntime | None = None

    async def startup(self, redis: Redis) -> None:
        if not self._store.bound:
            # A worker started by arq's CLI: the store uses arq's own pool.
            self._store.bind(redis)
        if self.runtime is not None:
            return  # arq's loop restarted after a Redis error: everything below is running
        await self._store.load_scripts()
        # The engine's per-job lines print the job's arguments (our payload): dropped even where
        # the service did not call configure_logging.
        silence_engine_job_lines()
        for hook in self._on_startup:
            await hook()
        recovery = JobRecovery(self._store, engine=self._engine, page_size=_RECOVERY_PAGE)
        self.runtime = WorkerRuntime(
            self._store, recovery=recovery,
            lease_s=self._settings.lease_s, reconcile_interval_s=self._settings.reconcile_interval_s,
            outage=self._outage,
            sweeps=self._sweeps,
            directory=WorkerDirectory(self._store, ttl_ms=int(self._settings.lease_s * 1000)),
            heartbeat_file=Path(self._settings.worker_heartbeat_file) if self._settings.worker_heartbeat_file else None,
        )
        await self.runtime.start()

    async def shutdown(self) -> None:
        await self.stop_runtime()
        for hook in self._on_shutdown:
            try:
                await hook()
            except Exception:
                logger.exception("worker shutdown hook %r failed", hook)

    async def stop_runtime(self) -> None:
        if self.runtime is not None:
            await self.runtime.stop()
            self.runtime = None

    async def run(self, name: str, payload: dict[str, Any], *, job_id: str, decision: StartDecision) -> Outcome:
        """Run one attempt. The job stays tracked (its lease renewed) until `release`: the hooks
        release it once its outcome is written, which may wait for Redis to come back."""
        runtime = self.runtime
        handle = runtime.track(job_id) if runtime is not None else RunHandle(job_id)
        if self._events is not None:
            handle.progress = ProgressReporter(partial(self._events.record_progress, job_id))
        try:
            return await self.runner(name).run(
                payload, job_id=job_id, user_uid=decision.user_uid, attempt=decision.attempts, handle=handle
            )
        finally:
            handle.ended = True
            if handle.progress is not None:
                # The last progress is written while the job is still STARTED, before its outcome.
                await handle.progress.close()

    def release(self, job_id: str) -> None:
        """The job's outcome is written (or left to recovery): stop renewing its lease."""
        if self.runtime is not None:
            self.runtime.release_ended(job_id)

    def runner(self, name: str) -> JobRunner:
        runner = self._runners.get(name)
        if runner is None:
            job_class = self._registry.job(name)
            if job_class is None:
                raise AgentError(f"no Job is registered for {name!r}")
            runner = JobRunner(job_class(self._resources), backoff=self._backoff, stop=self._stop,
                               context=self._job_context)
            self._runners[name] = runner
        return runner
