"""Agent: the only module that imports arq. It enqueues, runs workers and maps arq's hooks to JobState."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast
from zoneinfo import ZoneInfo

from arq.connections import ArqRedis, RedisSettings
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.cron import cron
from arq.jobs import serialize_job
from arq.worker import Retry, Worker, func
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError, RedisError

from agent_async.child import RunHandle
from agent_async.errors import AgentError, ConfigurationError
from agent_async.keys import KeySpace
from agent_async.overrides import ScheduleOverrides
from agent_async.persistency import EngineWrite, GateClaim, JobPersistency, StartDecision
from agent_async.recovery import dropped_outcome
from agent_async.registry import JobRegistry, registry
from agent_async.request import JobRequest
from agent_async.runner import Backoff, JobContextFactory, JobRunner, Outcome, StopPolicy
from agent_async.runtime import WorkerRuntime
from agent_async.schedule import translate
from agent_async.scheduler import Scheduler
from agent_async.scripts import LuaScript, ScriptCall, run_script
from agent_async.settings import AgentSettings
from agent_async.state import JobState, JobStatus, now_ms

if TYPE_CHECKING:
    from agent_async.storage import ClientStorage

__all__ = ["Agent", "EngineView"]

logger = logging.getLogger(__name__)

# arq's default lifetime of a queued job key past its run time (1 day).
_ENGINE_JOB_TTL_EXTRA_MS = 86_400_000
# arq counts pickups (shutdown requeues, redeliveries) as tries; our attempts are counted in the
# JobState. arq's own limit is set this far above max_try so it only acts as a last resort.
_PICKUP_SLACK = 5
# arq keeps the result of a job it dropped before running it (no hook is called then); the
# reconciler reads the reason from there.
_DROPPED_RESULT_KEEP_S = 3600
# The concurrency slot outlives the hard limit by this much before it expires on its own.
_GATE_SAFETY_S = 60
# arq's own timeout sits this far beyond our hard limit, as a backstop that should never fire.
_ARQ_TIMEOUT_MARGIN_S = 5.0
# Room for the runner's last wait after phase 2.
_AFTER_KILL_MARGIN_S = 2.0
# Backoff of the worker loop's restarts after Redis errors.
_REDIS_RETRY_MIN_S = 0.5
_REDIS_RETRY_MAX_S = 10.0
# arq keeps an in-progress key this long beyond its longest function timeout.
_ARQ_IN_PROGRESS_EXTRA_S = 10
# A cron tick only enqueues a run.
_CRON_TICK_TIMEOUT_S = 60
# When on_job_start could not reach Redis, the job is handed back to the queue for this long.
_START_FAILED_RETRY_S = 1.0
# Attempts (and the pause between them) to record an outcome before giving up to the reconciler.
_RECORD_TRIES = 3
_RECORD_PAUSE_S = 0.2

# ctx keys shared by our hooks and the job function within one arq run.
_CTX_DECISION = "agent_async.decision"
_CTX_OUTCOME = "agent_async.outcome"
# Set in the worker ctx by _AgentWorker: outcomes are committed inside arq's finish transaction.
_CTX_COMMIT_IN_FINISH = "agent_async.commit_in_finish"

# The script to prepend to arq's finish transaction, set only while that finish runs.
_FINISH_SCRIPT: ContextVar[ScriptCall | None] = ContextVar("agent_async_finish_script", default=None)


@dataclass(eq=False)
class _Piggyback:
    """A script riding on the next transaction arq opens in this task, and its reply."""

    call: ScriptCall
    sent: bool = False
    reply: Any = None


# The start transition riding on arq's pickup transaction (GET job, INCR tries), set only while
# _AgentWorker.run_job runs; on_job_start reads the reply from it.
_START_PIGGYBACK: ContextVar[_Piggyback | None] = ContextVar("agent_async_start", default=None)

WorkerHook = Callable[["Agent"], Awaitable[None]]


def _wire_default(value: object) -> object:
    # arq stores the exception of a job it dropped; keep its type and message only.
    if isinstance(value, BaseException):
        return {"exc_type": type(value).__name__, "message": str(value)}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def wire_dumps(value: Any) -> bytes:
    """arq job_serializer: JSON instead of pickle, so nothing read from Redis can run code."""
    return json.dumps(value, default=_wire_default, separators=(",", ":")).encode()


def wire_loads(raw: bytes) -> Any:
    return json.loads(raw)


@dataclass(frozen=True, slots=True)
class EngineView:
    """What arq knows of one job: still queued (or deferred), claimed by a worker, or why it dropped it."""

    queued: bool
    in_progress: bool
    dropped_reason: str | None
    # How long ago a worker claimed it (from the in-progress key's remaining TTL), if known.
    claimed_ms_ago: int | None = None


class Agent:
    """Wraps arq behind a domain API: create_job, worker settings, lifecycle hooks, the large store.

    Constructing it opens nothing; `async with agent:` (or `open()`) connects to Redis in the
    current process. A worker started through `worker_settings()` binds to arq's own pool instead.
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
        self.keys = KeySpace(settings.namespace)
        self.registry = job_registry
        self._store = store
        self._redis = redis
        self._owns_redis = redis is None
        self._persistency: JobPersistency | None = None
        self._job_context = job_context
        self._on_worker_startup = list(on_worker_startup)
        self._on_worker_shutdown = list(on_worker_shutdown)
        self._runners: dict[str, JobRunner] = {}
        self._backoff = Backoff(settings.retry_backoff_base_s, settings.retry_backoff_max_s)
        self._stop_policy = StopPolicy(settings.hard_timeout_grace_s, settings.cancel_grace_s)
        self._runtime: WorkerRuntime | None = None
        self._overrides = overrides
        self._scheduler: Scheduler | None = None
        # Outcomes waiting for arq's finish transaction, by engine job id (see _AgentWorker).
        self._commits: dict[str, ScriptCall] = {}
        if redis is not None:
            self._persistency = self._make_persistency(redis)

    # -- connection lifecycle --------------------------------------------------------------------

    async def open(self) -> None:
        if self._persistency is None:
            self._redis = Redis.from_url(self.settings.redis_url)
            self._owns_redis = True
            self._persistency = self._make_persistency(self._redis)

    async def close(self) -> None:
        if self._runtime is not None:
            await self._runtime.stop()
            self._runtime = None
        if self._store is not None:
            await self._store.close()
        if self._overrides is not None:
            await self._overrides.close()
        if self._owns_redis and self._redis is not None:
            await self._redis.aclose()
            self._redis = None
            self._persistency = None

    async def __aenter__(self) -> Agent:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _make_persistency(self, redis: Redis) -> JobPersistency:
        return JobPersistency(
            redis, keys=self.keys, retention_s=self.settings.state_retention_s,
            lease_ms=int(self.settings.lease_s * 1000),
        )

    @property
    def persistency(self) -> JobPersistency:
        if self._persistency is None:
            raise AgentError("the Agent is not connected: use `async with agent:` or await agent.open()")
        return self._persistency

    @property
    def redis(self) -> Redis:
        return self.persistency.redis

    @property
    def scheduler(self) -> Scheduler:
        """Periodic jobs: overrides live in the SQL database of AGENT_DATABASE_URL unless injected."""
        if self._scheduler is None:
            if self._overrides is None:
                self._overrides = ScheduleOverrides(self.settings.database_url, namespace=self.keys.namespace)
            self._scheduler = Scheduler(self, self._overrides)
        return self._scheduler

    def get_large_store(self) -> ClientStorage:
        """The large-blob store, scoped to the agent source; built on first use (opens nothing)."""
        if self._store is None:
            from agent_async.storage import StorageSource, create_storage

            self._store = create_storage(self.settings, StorageSource.AGENT)
        return self._store

    # -- enqueue ---------------------------------------------------------------------------------

    async def create_job(
        self,
        request: JobRequest,
        *,
        user_uid: str | None = None,
        job_id: str | None = None,
        schedule_name: str | None = None,
        defer_s: float = 0.0,
    ) -> JobState:
        """Take the gate slot, persist PENDING and queue the arq job in one Redis script."""
        state = JobState(
            job_id=job_id or uuid.uuid4().hex,
            name=request.name,
            user_uid=user_uid,
            payload=request.payload(),
            schedule_name=schedule_name,
        )
        await self.persistency.create(
            state,
            gate=self._gate_claim(type(request), user_uid),
            engine=self.engine_write(state, defer_s),
            resume=request.resume,
            max_try=request.max_try,
        )
        return state

    def _gate_claim(self, request_class: type[JobRequest], user_uid: str | None) -> GateClaim | None:
        if request_class.max_concurrent == 0:
            return None
        return GateClaim(
            key=self.keys.gate(request_class.name, user_uid),
            limit=request_class.max_concurrent,
            ttl_ms=int((self._longest_run_s(request_class) + _GATE_SAFETY_S) * 1000),
        )

    def _longest_run_s(self, request_class: type[JobRequest]) -> float:
        """Soft limit + the longer grace: no attempt of this request outlives it in a live worker."""
        grace_s = max(self.settings.hard_timeout_grace_s, self.settings.cancel_grace_s)
        return request_class.soft_timeout_seconds + grace_s + _AFTER_KILL_MARGIN_S

    def engine_write(self, state: JobState, defer_s: float = 0.0) -> EngineWrite:
        """The arq job to queue for a state (new, or re-queued after its worker was lost)."""
        engine_id = self.keys.engine_job_id(state.job_id)
        defer_ms = max(0, int(defer_s * 1000))
        job_bytes = serialize_job(
            state.name, (state.payload,), {}, None, state.created_ms, serializer=wire_dumps
        )
        now = now_ms()
        return EngineWrite(
            queue_key=self.keys.queue,
            job_key=job_key_prefix + engine_id,
            engine_job_id=engine_id,
            job_bytes=job_bytes,
            score_ms=now + defer_ms,
            ttl_ms=defer_ms + _ENGINE_JOB_TTL_EXTRA_MS,
        )

    def engine_in_progress_key(self, job_id: str) -> str:
        return in_progress_key_prefix + self.keys.engine_job_id(job_id)

    def engine_drop(self, job_id: str) -> tuple[str, str, str]:
        """(queue key, job key, engine job id): what to delete to take a job out of arq's queue."""
        engine_id = self.keys.engine_job_id(job_id)
        return self.keys.queue, job_key_prefix + engine_id, engine_id

    async def engine_views(self, job_ids: Sequence[str]) -> dict[str, EngineView]:
        """One pipelined look at arq's keys for each job."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                engine_id = self.keys.engine_job_id(job_id)
                pipe.exists(job_key_prefix + engine_id)
                pipe.pttl(in_progress_key_prefix + engine_id)
                pipe.get(result_key_prefix + engine_id)
            replies = await pipe.execute()
        claim_ttl_ms = self._in_progress_ttl_ms()
        views = {}
        for i, job_id in enumerate(job_ids):
            queued, ttl_ms, result = replies[3 * i: 3 * i + 3]
            in_progress = ttl_ms is not None and (ttl_ms > 0 or ttl_ms == -1)
            claimed_ms_ago = claim_ttl_ms - ttl_ms if in_progress and claim_ttl_ms and ttl_ms > 0 else None
            views[job_id] = EngineView(bool(queued), in_progress, _dropped_reason(result), claimed_ms_ago)
        return views

    def _in_progress_ttl_ms(self) -> int | None:
        """The TTL arq gives an in-progress key: its longest function timeout + 10 s (None: no jobs)."""
        timeouts = [
            self._longest_run_s(job.request_class) + _ARQ_TIMEOUT_MARGIN_S for job in self.registry.jobs().values()
        ]
        if any(cls.cron for cls in self.registry.requests().values()):
            timeouts.append(_CRON_TICK_TIMEOUT_S)
        return int((max(timeouts) + _ARQ_IN_PROGRESS_EXTRA_S) * 1000) if timeouts else None

    async def release_stale_claim(self, job_id: str) -> bool:
        """Let arq run again a job claimed by a worker that never started it (lost mid-pickup).

        Only while the state is still PENDING/RETRY: a job that started keeps its claim.
        """
        engine_id = self.keys.engine_job_id(job_id)
        released = await run_script(
            self.redis, _RELEASE_CLAIM([self.keys.state(job_id), in_progress_key_prefix + engine_id], [])
        )
        return bool(released)

    # -- worker ----------------------------------------------------------------------------------

    def worker_settings(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for arq's Worker, usable as `arq module.WorkerSettings` (a dict works)."""
        jobs = self.registry.jobs()
        if not jobs:
            raise ConfigurationError("no Job is registered: call init_jobs() before building a worker")
        functions = []
        for name, job_class in sorted(jobs.items()):
            request_class = job_class.request_class
            functions.append(func(
                self._job_entry(name),  # type: ignore[arg-type]
                name=name,
                # Our runner ends every attempt before this; arq's bare cancel is only a backstop.
                timeout=self._longest_run_s(request_class) + _ARQ_TIMEOUT_MARGIN_S,
                keep_result=0,
                max_tries=request_class.max_try + _PICKUP_SLACK,
            ))
        settings: dict[str, Any] = {
            "functions": functions,
            "cron_jobs": self._cron_jobs(),
            "timezone": ZoneInfo(self.settings.schedule_timezone),
            "queue_name": self.keys.queue,
            "redis_settings": RedisSettings.from_dsn(self.settings.redis_url),
            "on_startup": self._on_startup,
            "on_shutdown": self._on_shutdown,
            "on_job_start": self._on_job_start,
            "on_job_end": self._on_job_end,
            "job_serializer": wire_dumps,
            "job_deserializer": wire_loads,
            "poll_delay": self.settings.poll_delay_s,
            "max_jobs": self.settings.worker_max_jobs,
            "keep_result": _DROPPED_RESULT_KEEP_S,
            # SIGTERM: stop picking jobs, let running ones finish this long, then cancel them.
            "job_completion_wait": int(self.settings.shutdown_drain_s),
        }
        settings.update(overrides)
        return settings

    def _cron_jobs(self) -> list[Any]:
        """One arq cron per translated spec of each request's cron, plus a per-minute ticker for
        the schedules whose cron an override replaced at runtime."""
        jobs = []
        for name, request_class in sorted(self.registry.requests().items()):
            if not request_class.cron:
                continue
            for index, spec in enumerate(translate(request_class.cron)):
                jobs.append(cron(
                    self._cron_tick(name),  # type: ignore[arg-type]
                    name=self.keys.cron_function(name, index),
                    month=_as_set(spec.month), day=_as_set(spec.day), weekday=_as_set(spec.weekday),
                    hour=_as_set(spec.hour), minute=_as_set(spec.minute), second=0, microsecond=0,
                    unique=True, run_at_startup=False, timeout=_CRON_TICK_TIMEOUT_S, keep_result=0, max_tries=1,
                ))
        if jobs:
            jobs.append(cron(
                self._override_tick,
                name=self.keys.override_ticker, second=0, microsecond=0, unique=True,
                run_at_startup=False, timeout=_CRON_TICK_TIMEOUT_S, keep_result=0, max_tries=1,
            ))
        return jobs

    def _cron_tick(self, name: str) -> Callable[[dict[str, Any]], Awaitable[str]]:
        async def tick(ctx: dict[str, Any]) -> str:
            outcome = await self.scheduler.fire(name, _tick_time(ctx))
            logger.info("schedule %s: %s", name, outcome)
            return outcome

        tick.__qualname__ = f"cron_tick[{name}]"
        return tick

    async def _override_tick(self, ctx: dict[str, Any]) -> None:
        fired = {k: v for k, v in (await self.scheduler.tick_overrides(_tick_time(ctx))).items() if v != "not-mine"}
        if fired:
            logger.info("override tick: %s", fired)

    async def run_worker(self, *, burst: bool = False, **overrides: Any) -> None:
        """Run a worker in the current event loop until stopped (or, with burst, until the queue is empty).

        `handle_signals=True` lets arq own SIGINT/SIGTERM: stop taking jobs, drain for
        shutdown_drain_s, then hand the rest back (per `resume`). By default the host owns signals
        and stops the worker by cancelling this coroutine.
        """
        kwargs = self.worker_settings(**{"burst": burst, "handle_signals": False, **overrides})
        worker = _AgentWorker(agent=self, **kwargs)
        try:
            await self._main_surviving_redis(worker)
        finally:
            await worker.close()

    async def _main_surviving_redis(self, worker: Worker) -> None:
        """arq's poll loop ends on the first Redis error (arq #498); restart it with backoff."""
        delay_s = _REDIS_RETRY_MIN_S
        while True:
            started = time.monotonic()
            try:
                await worker.async_run()
                return
            except (RedisError, OSError) as exc:
                if time.monotonic() - started > _REDIS_RETRY_MAX_S:
                    delay_s = _REDIS_RETRY_MIN_S  # it had been running fine: start the backoff over
                logger.warning("Redis error in the worker loop (%s); retrying in %.1fs", exc, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(_REDIS_RETRY_MAX_S, delay_s * 2)

    def _runner(self, name: str) -> JobRunner:
        runner = self._runners.get(name)
        if runner is None:
            job_class = self.registry.job(name)
            if job_class is None:
                raise AgentError(f"no Job is registered for {name!r}")
            runner = JobRunner(
                job_class(self), backoff=self._backoff, stop=self._stop_policy, context=self._job_context
            )
            self._runners[name] = runner
        return runner

    def _job_entry(self, name: str) -> Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]:
        async def run(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
            decision: StartDecision | None = ctx.get(_CTX_DECISION)
            if decision is None:
                # on_job_start could not record STARTED: hand the job back rather than run it untracked.
                raise Retry(defer=_START_FAILED_RETRY_S)
            if not decision.run:
                return
            job_id = self.keys.job_id_from_engine(ctx["job_id"]) or ctx["job_id"]
            runtime = self._runtime
            handle = runtime.track(job_id) if runtime is not None else RunHandle(job_id)
            try:
                outcome = await self._runner(name).run(
                    payload, job_id=job_id, user_uid=decision.user_uid, attempt=decision.attempts, handle=handle
                )
            finally:
                if runtime is not None:
                    runtime.untrack(job_id)
            ctx[_CTX_OUTCOME] = outcome
            if outcome.status is JobStatus.RETRY:
                raise Retry(defer=outcome.retry_in_s)

        run.__qualname__ = f"agent_job[{name}]"
        return run

    # -- arq hooks: they never raise, since a raising hook kills arq's poll loop -----------------

    async def _on_startup(self, ctx: dict[str, Any]) -> None:
        if self._persistency is None:
            self._redis = ctx["redis"]
            self._owns_redis = False
            self._persistency = self._make_persistency(ctx["redis"])
        if self._runtime is not None:
            return  # arq's loop restarted after a Redis error: everything below is running
        await self.persistency.load_scripts()
        for hook in self._on_worker_startup:
            await hook(self)
        self._runtime = WorkerRuntime(self)
        await self._runtime.start()

    async def _on_shutdown(self, ctx: dict[str, Any]) -> None:
        if self._runtime is not None:
            await self._runtime.stop()
            self._runtime = None
        for hook in self._on_worker_shutdown:
            try:
                await hook(self)
            except Exception:
                logger.exception("worker shutdown hook %r failed", hook)

    async def _on_job_start(self, ctx: dict[str, Any]) -> None:
        engine_id = ctx.get("job_id", "?")
        if self.keys.is_cron_tick(engine_id):
            # A schedule's tick: it creates a tracked run, it is not one.
            ctx[_CTX_DECISION] = StartDecision(run=False, reason="cron tick")
            return
        job_id = self.keys.job_id_from_engine(engine_id)
        piggyback = _START_PIGGYBACK.get()
        try:
            if job_id is None:
                ctx[_CTX_DECISION] = StartDecision(run=False, reason="not a job of this namespace")
            elif piggyback is not None and piggyback.sent and not isinstance(piggyback.reply, Exception):
                ctx[_CTX_DECISION] = self.persistency.parse_start(piggyback.reply)
            else:
                ctx[_CTX_DECISION] = await self.persistency.start(job_id)
        except Exception:
            logger.exception("job %s: could not record STARTED; it goes back to the queue", engine_id)
            return
        decision = ctx[_CTX_DECISION]
        if not decision.run:
            logger.warning("job %s not run: %s", engine_id, decision.reason)

    async def _on_job_end(self, ctx: dict[str, Any]) -> None:
        decision: StartDecision | None = ctx.get(_CTX_DECISION)
        if decision is None or not decision.run:
            return
        job_id = self.keys.job_id_from_engine(ctx["job_id"]) or ctx["job_id"]
        outcome: Outcome | None = ctx.get(_CTX_OUTCOME)
        if outcome is None:
            outcome = self._interrupted_outcome(decision)
        if ctx.get(_CTX_COMMIT_IN_FINISH):
            self._commits[ctx["job_id"]] = self.persistency.transition_call(
                job_id, outcome.status, result=outcome.result, error=outcome.error
            )
            return
        await self.record_outcome(job_id, outcome)

    async def record_outcome(self, job_id: str, outcome: Outcome) -> None:
        """Write an outcome on its own, retrying a few times; the reconciler covers a final failure."""
        for attempt in range(1, _RECORD_TRIES + 1):
            try:
                await self.persistency.transition(
                    job_id, outcome.status, result=outcome.result, error=outcome.error
                )
                return
            except Exception:
                if attempt == _RECORD_TRIES:
                    logger.exception("job %s: could not record %s; the reconciler will", job_id, outcome.status)
                    return
                await asyncio.sleep(_RECORD_PAUSE_S * attempt)

    def _dropped_call(self, engine_id: str, result_data: bytes | None) -> ScriptCall | None:
        job_id = self.keys.job_id_from_engine(engine_id)
        if job_id is None:
            return None
        status, error = dropped_outcome(_dropped_reason(result_data))
        # Under _AgentWorker the pickup transaction already marked it STARTED: undo that count.
        return self.persistency.transition_call(job_id, status, error=error, undo_start=True)

    def _interrupted_outcome(self, decision: StartDecision) -> Outcome:
        """arq cancelled the attempt itself: a worker shutdown past its drain time.

        arq puts the job back in the queue; whether it may run again is the request's `resume`.
        """
        request_class = self.registry.request(decision.name)
        if request_class is not None and request_class.resume:
            return Outcome(JobStatus.PENDING, error="interrupted by worker shutdown; queued again")
        return Outcome(JobStatus.FAILURE, error="WorkerShutdown: interrupted by worker shutdown (resume is off)")


class _PoolWithScript:
    """arq's pool, except that each transactional pipeline starts with one of our scripts."""

    def __init__(self, pool: ArqRedis, call: ScriptCall) -> None:
        self._pool = pool
        self._call = call

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        pipe = self._pool.pipeline(transaction=transaction, shard_hint=shard_hint)
        self._call.queue_on(pipe)
        return pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def _as_set(values: frozenset[int] | None) -> set[int] | None:
    return None if values is None else set(values)


def _tick_time(ctx: dict[str, Any]) -> datetime:
    """The fire time of an arq cron tick: its job id ends with it, in ms (arq's unique cron id)."""
    return datetime.fromtimestamp(int(str(ctx["job_id"]).rsplit(":", 1)[1]) / 1000, UTC)


class _PipelineWithStart:
    """arq's pickup pipeline with our start script queued first; arq sees only its own replies."""

    def __init__(self, pipe: Pipeline, piggyback: _Piggyback) -> None:
        self._pipe = pipe
        self._piggyback = piggyback
        piggyback.call.queue_on(pipe)
        piggyback.sent = True

    async def __aenter__(self) -> _PipelineWithStart:
        await self._pipe.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._pipe.__aexit__(*exc_info)  # type: ignore[no-untyped-call]

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        replies = await self._pipe.execute(raise_on_error=False)
        self._piggyback.reply, rest = replies[0], replies[1:]
        if raise_on_error:
            for reply in rest:
                if isinstance(reply, Exception):
                    raise reply
        return list(rest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


class _PoolWithStart:
    """arq's pool, whose next pipeline carries our start script (see _AgentWorker.run_job)."""

    def __init__(self, pool: ArqRedis, piggyback: _Piggyback) -> None:
        self._pool = pool
        self._piggyback = piggyback

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> _PipelineWithStart:
        return _PipelineWithStart(self._pool.pipeline(transaction=transaction, shard_hint=shard_hint), self._piggyback)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


# Drops arq's in-progress mark of a job that never started. KEYS: state, in-progress key
_RELEASE_CLAIM = LuaScript("""
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'PENDING' or status == 'RETRY' then return redis.call('DEL', KEYS[2]) end
return 0
""")

# arq's claim of a queued job, as one script: not already in progress, due, then mark it in
# progress. arq does the same with WATCH, EXISTS, ZSCORE and MULTI/EXEC: four round trips.
# KEYS: in-progress key, queue   ARGV: now ms, in-progress ttl ms, engine job id
_CLAIM = LuaScript("""
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local score = redis.call('ZSCORE', KEYS[2], ARGV[3])
if not score or tonumber(score) > tonumber(ARGV[1]) then return false end
redis.call('PSETEX', KEYS[1], ARGV[2], '1')
return score
""")


class _AgentWorker(Worker):
    """arq's Worker with fewer round trips per job, used by `Agent.run_worker`.

    - A job is claimed with one script instead of arq's four-step optimistic transaction.
    - The START transition rides on arq's pickup transaction, and the outcome on arq's finish
      transaction: no window in which arq has forgotten a job whose state is not terminal.
    - Jobs that arq drops before running them (no hook is called) are ended in that same finish.
    Under `arq`'s own CLI the plain Worker is used: the hooks then write the states themselves
    and the recovery pass ends dropped jobs.
    """

    def __init__(self, *, agent: Agent, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._agent = agent
        self.ctx[_CTX_COMMIT_IN_FINISH] = True

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        """Claim and start each due job (arq's start_jobs, with the claim as one script)."""
        ttl_ms = int(self.in_progress_timeout_s * 1000)
        for raw_id in job_ids:
            await self.sem.acquire()
            if self.job_counter >= self.max_jobs:
                self.sem.release()
                return
            self.job_counter += 1
            job_id = raw_id.decode()
            try:
                score = await run_script(
                    self.pool, _CLAIM([in_progress_key_prefix + job_id, self.queue_name], [now_ms(), ttl_ms, job_id])
                )
            except BaseException:
                self._release_sem_dec_counter_on_complete()
                raise
            if score is None:
                # Started elsewhere, finished, or re-queued later by another worker.
                self._release_sem_dec_counter_on_complete()
                continue
            task = self.loop.create_task(self.run_job(job_id, int(float(score))))
            task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
            self.tasks[job_id] = task

    @property
    def pool(self) -> ArqRedis:
        base = cast(ArqRedis, self._pool)
        start = _START_PIGGYBACK.get()
        if start is not None and not start.sent:
            return cast(ArqRedis, _PoolWithStart(base, start))
        call = _FINISH_SCRIPT.get()
        return cast(ArqRedis, _PoolWithScript(base, call)) if call is not None else base

    async def run_job(self, job_id: str, score: int) -> None:
        # The start transition rides on arq's first transaction of the run (GET job, INCR
        # tries): one round trip less per job. If arq then drops the job before running it, our
        # finish_failed_job ends the state.
        own_id = self._agent.keys.job_id_from_engine(job_id)
        if own_id is None or self._agent.keys.is_cron_tick(job_id):
            await super().run_job(job_id, score)
            return
        token = _START_PIGGYBACK.set(_Piggyback(self._agent.persistency.start_call(own_id)))
        try:
            await super().run_job(job_id, score)
        finally:
            _START_PIGGYBACK.reset(token)

    async def finish_job(self, job_id: str, *args: Any) -> None:
        call = self._agent._commits.pop(job_id, None)
        await self._finish_with(call, lambda: super(_AgentWorker, self).finish_job(job_id, *args))

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        call = self._agent._dropped_call(job_id, result_data)
        await self._finish_with(call, lambda: super(_AgentWorker, self).finish_failed_job(job_id, result_data))

    async def _finish_with(self, call: ScriptCall | None, finish: Callable[[], Awaitable[None]]) -> None:
        token = _FINISH_SCRIPT.set(call)
        try:
            await finish()
        except NoScriptError:
            # Redis lost our scripts (restart, SCRIPT FLUSH) while arq's part of EXEC went
            # through: write the outcome on its own, which loads the script again.
            await self._write_alone(call)
        except RedisError:
            # arq would let this escape and end the worker loop; log it and keep serving. What
            # was not written is found by the reconciler (state) or redelivered (arq's job).
            logger.exception("finishing a job failed; the reconciler will settle its state")
        finally:
            _FINISH_SCRIPT.reset(token)

    async def _write_alone(self, call: ScriptCall | None) -> None:
        if call is None:
            return
        try:
            await self._agent.persistency.run(call)
        except RedisError:
            logger.exception("recording an outcome failed; the reconciler will settle its state")


def _dropped_reason(raw: bytes | None) -> str | None:
    if not raw:
        return None
    try:
        result = json.loads(raw).get("r")
    except (ValueError, AttributeError):
        return "unreadable engine result"
    if isinstance(result, dict) and "exc_type" in result:
        return f"{result['exc_type']}: {result.get('message', '')}".rstrip(": ")
    return str(result)

