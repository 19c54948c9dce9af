"""The queue engine (arq) behind one door: the only package that imports arq or knows its data model.

The rest of the library depends on `Engine`, `EngineView` and the protocols its hooks call
(`JobHandler`, `ScheduleTicker`), never on arq's names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from arq.connections import RedisSettings
from arq.cron import CronJob
from arq.cron import cron as arq_cron
from arq.worker import Function, func

from agent_async.engine.claim import ENGINE_LUA
from agent_async.engine.cron import translate
from agent_async.engine.hooks import Hooks, JobHandler, ScheduleTicker
from agent_async.engine.stoppable import StoppableWorker, run_stopping_on_signal, run_surviving_redis
from agent_async.engine.wire import (
    IN_PROGRESS_EXTRA_S,
    JOB_TTL_EXTRA_MS,
    Dropped,
    EngineNames,
    dropped_from_result,
    serialize,
    wire_dumps,
    wire_loads,
)
from agent_async.engine.worker import FastWorker
from agent_async.errors import ConfigurationError
from agent_async.lifecycle import attempt_budget_s, now_ms
from agent_async.outage import RedisOutage
from agent_async.registry import JobRegistry
from agent_async.settings import AgentSettings
from agent_async.state import JobState
from agent_async.store import EngineJob, EngineQueue, EngineRef, EngineRun, JobStore, LuaScript, lua_source, run_script

__all__ = [
    "STORE_LUA", "Dropped", "Engine", "EngineView", "JobHandler", "QueueStats", "ScheduleTicker", "engine_queue",
]

# The engine's Lua library, loaded in front of every store script (see store/jobs.py).
STORE_LUA = ENGINE_LUA

# arq's stock worker counts pickups (shutdown requeues, redeliveries) as tries; our attempts are
# counted in the JobState (and are the fast worker's tries: engine/lua/pickup.lua). arq's own limit
# is set this far above max_try so it only acts as a last resort.
_PICKUP_SLACK = 5
# arq keeps the result of a job it dropped before running it (no hook is called then); the
# reconciler reads the reason from there.
_DROPPED_RESULT_KEEP_S = 3600
# arq's own timeout sits this far beyond our hard limit, as a backstop that should never fire.
_ARQ_TIMEOUT_MARGIN_S = 5.0
# A cron tick only enqueues a run.
_CRON_TICK_TIMEOUT_S = 60

_RELEASE_CLAIM = LuaScript(ENGINE_LUA + "\n" + lua_source("agent_async.engine", "release_claim.lua"))


def engine_queue(namespace: str) -> EngineQueue:
    """Where the store's enqueue script queues this namespace's new jobs (see EngineQueue)."""
    names = EngineNames(namespace)
    return EngineQueue(queue_key=names.queue, id_prefix=names.engine_job_id(""))


@dataclass(frozen=True, slots=True)
class EngineView:
    """What arq knows of one job: still queued (or deferred), claimed by a worker, or why it dropped it."""

    queued: bool
    in_progress: bool
    dropped: Dropped | None
    # How long ago a worker claimed it (from the in-progress key's remaining TTL), if known.
    claimed_ms_ago: int | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """The engine's queue: every job in it, those due now, and the wait of the oldest due one."""

    depth: int
    due: int
    oldest_due_age_s: float


class Engine:
    """arq for one namespace: queue a job's bytes, find or drop it, and build and run workers.

    Constructing it opens nothing; it reaches Redis through the store once the store is bound.
    """

    def __init__(
        self, settings: AgentSettings, *, store: JobStore, registry: JobRegistry, outage: RedisOutage | None = None
    ) -> None:
        self._settings = settings
        self._store = store
        self._registry = registry
        self._outage = outage or RedisOutage()
        self.names = EngineNames(settings.namespace)

    # -- queue -------------------------------------------------------------------------------

    def job(self, state: JobState, defer_s: float = 0.0) -> EngineJob:
        """The arq job to queue for a state again (its worker was lost) or for a group's child."""
        run = self.run_at(defer_s)
        return EngineJob(
            ref=self.names.ref(state.job_id),
            job_bytes=serialize(state.name, state.payload, state.created_ms),
            score_ms=run.score_ms,
            ttl_ms=run.ttl_ms,
        )

    def run_at(self, defer_s: float = 0.0) -> EngineRun:
        """When a new job is to run (now, or `defer_s` later), and how long arq keeps it."""
        defer_ms = max(0, int(defer_s * 1000))
        return EngineRun(score_ms=now_ms() + defer_ms, ttl_ms=defer_ms + JOB_TTL_EXTRA_MS)

    def ref(self, job_id: str) -> EngineRef:
        """Where arq keeps a job: what to delete to take it out of arq's queue."""
        return self.names.ref(job_id)

    async def views(self, job_ids: Sequence[str]) -> dict[str, EngineView]:
        """One pipelined look at arq's keys for each job."""
        async with self._store.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                ref = self.names.ref(job_id)
                pipe.exists(ref.job_key)
                pipe.pttl(ref.claim_key)
                pipe.get(self.names.result_key(job_id))
            replies = await pipe.execute()
        claim_ttl_ms = self.claim_ttl_ms()
        views = {}
        for i, job_id in enumerate(job_ids):
            queued, ttl_ms, result = replies[3 * i: 3 * i + 3]
            in_progress = ttl_ms is not None and (ttl_ms > 0 or ttl_ms == -1)
            claimed_ms_ago = claim_ttl_ms - ttl_ms if in_progress and claim_ttl_ms and ttl_ms > 0 else None
            views[job_id] = EngineView(bool(queued), in_progress, dropped_from_result(result), claimed_ms_ago)
        return views

    async def queue_stats(self) -> QueueStats:
        """How many engine jobs are queued (due or deferred), and how long the oldest due one waits."""
        redis = self._store.redis
        now = now_ms()
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.names.queue)
            pipe.zcount(self.names.queue, "-inf", now)
            pipe.zrange(self.names.queue, 0, 0, withscores=True)
            depth, due, oldest = await pipe.execute()
        oldest_age_s = max(0.0, (now - oldest[0][1]) / 1000) if due and oldest else 0.0
        return QueueStats(depth=int(depth), due=int(due), oldest_due_age_s=round(oldest_age_s, 3))

    def claim_ttl_ms(self) -> int | None:
        """The TTL arq gives a claim (in-progress key): its longest function timeout + 10 s."""
        timeouts = [self._arq_timeout_s(job.request_class) for job in self._registry.jobs().values()]
        if any(cls.cron for cls in self._registry.requests().values()):
            timeouts.append(_CRON_TICK_TIMEOUT_S)
        return int((max(timeouts) + IN_PROGRESS_EXTRA_S) * 1000) if timeouts else None

    async def release_stale_claim(self, job_id: str) -> bool:
        """Let arq run again a job claimed by a worker that never started it (lost mid-pickup).

        Only while the state is still PENDING/RETRY: a job that started keeps its claim.
        """
        ref = self.names.ref(job_id)
        call = _RELEASE_CLAIM([self._store.keys.state(job_id), ref.claim_key, self.names.queue], [])
        return bool(await run_script(self._store.redis, call))

    # -- workers -----------------------------------------------------------------------------

    def worker_settings(
        self, *, jobs: JobHandler, schedules: Callable[[], ScheduleTicker], **overrides: Any
    ) -> dict[str, Any]:
        """Keyword arguments for arq's Worker, usable as `arq module.WorkerSettings` (a dict works)."""
        return self._settings_for(self._hooks(jobs, schedules), overrides)

    async def run_worker(
        self,
        *,
        jobs: JobHandler,
        schedules: Callable[[], ScheduleTicker],
        burst: bool = False,
        stock_worker: bool = False,
        **overrides: Any,
    ) -> None:
        """Run a worker in the current event loop until stopped or, with `burst`, until the queue
        is empty: the fast worker (see FastWorker), restarted after Redis errors, or with
        `stock_worker` arq's own Worker exactly as `arq module.WorkerSettings` runs it."""
        hooks = self._hooks(jobs, schedules)
        # A worker process owns its signals (SIGTERM drains); one run from another thread cannot.
        handle_signals = threading.current_thread() is threading.main_thread()
        kwargs = self._settings_for(hooks, {"burst": burst, "handle_signals": handle_signals, **overrides})
        if stock_worker:
            stock = StoppableWorker(**kwargs)
            try:
                await run_stopping_on_signal(stock)
            finally:
                await stock.close()
            return
        worker = FastWorker(
            hooks=hooks, names=self.names, push_wakeup=self._settings.worker_push_wakeup,
            max_block_s=self._settings.worker_max_block_s, coalesce=self._settings.worker_coalesce,
            finish_linger_ms=self._settings.worker_finish_linger_ms, **kwargs,
        )
        try:
            await run_surviving_redis(worker, self._outage)
        finally:
            await worker.close()

    def _hooks(self, jobs: JobHandler, schedules: Callable[[], ScheduleTicker]) -> Hooks:
        return Hooks(
            store=self._store, names=self.names, registry=self._registry, jobs=jobs, schedules=schedules,
            outage=self._outage, freeze_gc=self._settings.worker_gc_freeze,
        )

    def _settings_for(self, hooks: Hooks, overrides: dict[str, Any]) -> dict[str, Any]:
        functions = self._functions(hooks)
        settings: dict[str, Any] = {
            "functions": functions,
            "cron_jobs": self._cron_jobs(hooks),
            "timezone": ZoneInfo(self._settings.schedule_timezone),
            "queue_name": self.names.queue,
            "redis_settings": RedisSettings.from_dsn(self._settings.redis_url),
            "on_startup": hooks.on_startup,
            "on_shutdown": hooks.on_shutdown,
            "on_job_start": hooks.on_job_start,
            "on_job_end": hooks.on_job_end,
            "job_serializer": wire_dumps,
            "job_deserializer": wire_loads,
            "poll_delay": self._settings.poll_delay_s,
            "max_jobs": self._settings.worker_max_jobs,
            "keep_result": _DROPPED_RESULT_KEEP_S,
            # SIGTERM: stop picking jobs, let running ones finish this long, then cancel them.
            "job_completion_wait": int(self._settings.shutdown_drain_s),
        }
        settings.update(overrides)
        return settings

    def _arq_timeout_s(self, request_class: Any) -> float:
        # Our runner ends every attempt before this; arq's bare cancel is only a backstop.
        return attempt_budget_s(request_class, self._settings) + _ARQ_TIMEOUT_MARGIN_S

    def _functions(self, hooks: Hooks) -> list[Function]:
        jobs = self._registry.jobs()
        if not jobs:
            raise ConfigurationError("no Job is registered: call init_jobs() before building a worker")
        return [
            func(
                hooks.job_entry(name),  # type: ignore[arg-type]
                name=name,
                timeout=self._arq_timeout_s(job_class.request_class),
                keep_result=0,
                max_tries=job_class.request_class.max_try + _PICKUP_SLACK,
            )
            for name, job_class in sorted(jobs.items())
        ]

    def _cron_jobs(self, hooks: Hooks) -> list[CronJob]:
        """One arq cron per translated spec of each request's cron, plus a per-minute ticker for
        the schedules whose cron an override replaced at runtime."""
        jobs = []
        tick_options: dict[str, Any] = {
            "second": 0, "microsecond": 0, "unique": True, "run_at_startup": False,
            "timeout": _CRON_TICK_TIMEOUT_S, "keep_result": 0, "max_tries": 1,
        }
        for name, request_class in sorted(self._registry.requests().items()):
            if not request_class.cron:
                continue
            for index, spec in enumerate(translate(request_class.cron)):
                jobs.append(arq_cron(
                    hooks.cron_tick(name),  # type: ignore[arg-type]
                    name=self.names.cron_function(name, index),
                    month=_as_set(spec.month), day=_as_set(spec.day), weekday=_as_set(spec.weekday),
                    hour=_as_set(spec.hour), minute=_as_set(spec.minute), **tick_options,
                ))
        if jobs:
            jobs.append(arq_cron(hooks.override_tick, name=self.names.override_ticker, **tick_options))
        return jobs


def _as_set(values: frozenset[int] | None) -> set[int] | None:
    return None if values is None else set(values)
