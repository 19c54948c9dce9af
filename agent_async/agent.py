"""Agent: the composition root. It builds the store, the engine, the worker service and the
scheduler for one namespace, owns their Redis connection, and holds the enqueue path."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from agent_async.engine import STORE_LUA, Engine, engine_queue
from agent_async.errors import StorageError
from agent_async.groups import Groups
from agent_async.job import JobResources
from agent_async.lifecycle import attempt_budget_s
from agent_async.outage import RedisOutage
from agent_async.owned_blobs import OwnedBlobs
from agent_async.registry import JobRegistry, registry
from agent_async.request import JobRequest
from agent_async.runs import RunRecords
from agent_async.schedules.overrides import ScheduleOverrides
from agent_async.schedules.scheduler import Scheduler
from agent_async.settings import AgentSettings
from agent_async.state import JobState, new_job_id
from agent_async.store import GateClaim, JobStore, KeySpace, check_buffers
from agent_async.store.events import EventLog
from agent_async.store.groups import GroupStore
from agent_async.worker import JobContextFactory, WorkerService

if TYPE_CHECKING:
    from agent_async.storage import ClientStorage

__all__ = ["Agent"]

logger = logging.getLogger(__name__)

# The concurrency slot outlives an attempt's longest run by this much before it expires on its own.
_GATE_SAFETY_S = 60

WorkerHook = Callable[["Agent"], Awaitable[None]]


class Agent:
    """The job layer of one namespace: `create_job`, worker settings, a worker, the large store.

    Constructing it opens nothing; `async with agent:` (or `open()`) connects to Redis in the
    current process. A worker started through `worker_settings()` binds to arq's own pool instead.
    `on_worker_startup`/`on_worker_shutdown` hooks receive the Agent once per worker process.
    """

    def __init__(
        self,
        settings: AgentSettings,
        *,
        job_registry: JobRegistry = registry,
        store: ClientStorage | None = None,
        redis: Redis | None = None,
        job_context: JobContextFactory | None = None,
        on_worker_startup: Sequence[WorkerHook] = (),
        on_worker_shutdown: Sequence[WorkerHook] = (),
        overrides: ScheduleOverrides | None = None,
    ) -> None:
        self.settings = settings
        self.registry = job_registry
        self.keys = KeySpace(settings.namespace)
        self.job_store = JobStore(
            keys=self.keys, retention_s=settings.state_retention_s, lease_ms=int(settings.lease_s * 1000),
            engine_lua=STORE_LUA, engine_queue=engine_queue(settings.namespace), events=settings.events_enabled,
            metrics=settings.metrics_enabled, enqueue_resend_s=settings.enqueue_resend_s,
        )
        # One outage report per process, whichever loop meets it first.
        outage = RedisOutage()
        self.engine = Engine(settings, store=self.job_store, registry=job_registry, outage=outage)
        group_store = GroupStore(self.job_store, engine_lua=STORE_LUA)
        self.groups = Groups(self.job_store, groups=group_store, engine=self.engine)
        self.resources = JobResources(
            settings, redis=lambda: self.job_store.redis, large_store=self.get_large_store, groups=self.groups
        )
        self.owned_blobs = OwnedBlobs(self.job_store, large_store=self.get_large_store)
        self.events = EventLog(self.job_store, engine_lua=STORE_LUA)
        self.worker = WorkerService(
            self.job_store,
            engine=self.engine,
            registry=job_registry,
            settings=settings,
            resources=self.resources,
            job_context=job_context,
            # Runs a crashed worker left `running` are ended at once, not a whole stale period later.
            on_startup=[self._mark_stale_runs, *(self._bound_hook(hook) for hook in on_worker_startup)],
            on_shutdown=[self._bound_hook(hook) for hook in on_worker_shutdown],
            outage=outage,
            sweeps=[self.owned_blobs.sweep, self.groups.finalize_pending],
            events=self.events,
        )
        self._large_store = store
        self._overrides = overrides
        self._scheduler: Scheduler | None = None
        self._runs: RunRecords | None = None
        self._owns_redis = False
        if redis is not None:
            self.job_store.bind(redis)

    # -- connection lifecycle --------------------------------------------------------------------

    async def open(self) -> None:
        if not self.job_store.bound:
            # Our own client: its pool checks connections without redis-py 5's zero-timeout read.
            self.job_store.bind(check_buffers(Redis.from_url(self.settings.redis_url)))
            self._owns_redis = True

    async def close(self) -> None:
        await self.worker.stop_runtime()
        if self._large_store is not None:
            await self._large_store.close()
        if self._overrides is not None:
            await self._overrides.close()
        if self._runs is not None:
            await self._runs.close()
        if self._owns_redis:
            await self.job_store.redis.aclose()
            self.job_store.bind(None)
            self._owns_redis = False

    async def __aenter__(self) -> Agent:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def redis(self) -> Redis:
        return self.job_store.redis

    @property
    def scheduler(self) -> Scheduler:
        """Periodic jobs: overrides live in the SQL database of AGENT_DATABASE_URL unless injected."""
        if self._scheduler is None:
            if self._overrides is None:
                self._overrides = ScheduleOverrides(self.settings.database_url, namespace=self.keys.namespace)
            self._scheduler = Scheduler(
                registry=self.registry, store=self.job_store, create_job=self.create_job,
                overrides=self._overrides, settings=self.settings,
            )
        return self._scheduler

    @property
    def runs(self) -> RunRecords:
        """Run records, in the SQL database of AGENT_DATABASE_URL (built on first use, opens nothing)."""
        if self._runs is None:
            self._runs = RunRecords.from_settings(self.settings)
        return self._runs

    async def _mark_stale_runs(self) -> None:
        try:
            stale = await self.runs.mark_stale()
        except StorageError as exc:
            # No run records in this database (not migrated, or not used): nothing to clean up.
            logger.info("run records not checked for stale runs (%s)", exc)
            return
        if stale:
            logger.warning("%d stale run record(s) ended as error (their worker was lost)", stale)

    def get_large_store(self) -> ClientStorage:
        """The large-blob store, scoped to the agent source; built on first use (opens nothing)."""
        if self._large_store is None:
            from agent_async.storage import StorageSource, create_storage

            self._large_store = create_storage(self.settings, StorageSource.AGENT)
        return self._large_store

    # -- enqueue ---------------------------------------------------------------------------------

    async def create_job(
        self,
        request: JobRequest,
        *,
        user_uid: str | None = None,
        job_id: str | None = None,
        schedule_name: str | None = None,
        defer_s: float = 0.0,
        retry_of: str | None = None,
    ) -> JobState:
        """Take the gate slot, persist PENDING and queue the engine job in one Redis script."""
        state = JobState(
            job_id=job_id or new_job_id(),
            name=request.name,
            user_uid=user_uid,
            payload=request.payload(),
            schedule_name=schedule_name,
            retry_of=retry_of,
        )
        await self.job_store.create(
            state,
            gate=self.gate_claim(type(request), user_uid),
            run=self.engine.run_at(defer_s),
            resume=request.resume,
            max_try=request.max_try,
            owned_blobs=request.owned_blob_refs(),
            new_id=job_id is None,
        )
        return state

    def gate_claim(self, request_class: type[JobRequest], user_uid: str | None) -> GateClaim | None:
        """The concurrency gate a new job of this request class and user takes (None: no limit)."""
        if request_class.max_concurrent == 0:
            return None
        return GateClaim(
            key=self.keys.gate(request_class.name, user_uid),
            limit=request_class.max_concurrent,
            ttl_ms=int((attempt_budget_s(request_class, self.settings) + _GATE_SAFETY_S) * 1000),
        )

    # -- worker ----------------------------------------------------------------------------------

    def worker_settings(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for arq's Worker, usable as `arq module.WorkerSettings` (a dict works)."""
        return self.engine.worker_settings(jobs=self.worker, schedules=lambda: self.scheduler, **overrides)

    async def run_worker(self, *, burst: bool = False, stock_worker: bool = False, **overrides: Any) -> None:
        """Run a worker in the current event loop until stopped (or, with burst, until the queue is empty).

        In the main thread the worker owns SIGINT/SIGTERM: it stops taking jobs, lets running ones
        finish for shutdown_drain_s, hands the rest back (per `resume`) and returns normally, also
        while it is waiting for an unreachable Redis. Pass `handle_signals=False` when the host owns
        signals: it then stops the worker by cancelling this coroutine (running jobs are handed
        back at once). `stock_worker=True` runs arq's own Worker, as `arq module.WorkerSettings`
        would, instead of the fast one (tests run both).
        """
        await self.engine.run_worker(
            jobs=self.worker, schedules=lambda: self.scheduler, burst=burst, stock_worker=stock_worker, **overrides
        )

    def _bound_hook(self, hook: WorkerHook) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            await hook(self)

        return call
