"""The fast worker: arq's Worker with fewer round trips per job, and a loop that survives Redis errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from signal import Signals
from typing import Any, cast

from arq.connections import ArqRedis
from arq.worker import Worker
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError, RedisError

from agent_async.engine.hooks import CTX_COMMIT_IN_FINISH, START_PIGGYBACK, Hooks, Piggyback
from agent_async.engine.wire import EngineNames
from agent_async.lifecycle import now_ms
from agent_async.outage import OUTAGE_ERRORS, RedisOutage
from agent_async.store import LuaScript, ScriptCall, lua_source, run_script

__all__ = ["FastWorker", "StoppableWorker", "run_stopping_on_signal", "run_surviving_redis"]

logger = logging.getLogger(__name__)

# Backoff of the worker loop's restarts after Redis errors: short, since a retry while Redis is down
# costs one failed connect, and a long pause would outlast a short outage by seconds.
_REDIS_RETRY_MIN_S = 0.5
_REDIS_RETRY_MAX_S = 2.0

_CLAIM = LuaScript(lua_source("agent_async.engine", "claim.lua"))

# The script to prepend to arq's finish transaction, set only while that finish runs.
_FINISH_SCRIPT: ContextVar[ScriptCall | None] = ContextVar("agent_async_finish_script", default=None)


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


class _PipelineWithStart:
    """arq's pickup pipeline with our start script queued first; arq sees only its own replies."""

    def __init__(self, pipe: Pipeline, piggyback: Piggyback) -> None:
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
    """arq's pool, whose next pipeline carries our start script (see FastWorker.run_job)."""

    def __init__(self, pool: ArqRedis, piggyback: Piggyback) -> None:
        self._pool = pool
        self._piggyback = piggyback

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> _PipelineWithStart:
        return _PipelineWithStart(self._pool.pipeline(transaction=transaction, shard_hint=shard_hint), self._piggyback)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


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


class FastWorker(StoppableWorker):
    """arq's Worker with fewer round trips per job (`Agent.run_worker`, `python -m app worker`).

    - A job is claimed with one script instead of arq's four-step optimistic transaction.
    - The START transition rides on arq's pickup transaction, and the outcome on arq's finish
      transaction: no window in which arq has forgotten a job whose state is not terminal.
    - Jobs that arq drops before running them (no hook is called) are ended in that same finish.
    It overrides arq internals (start_jobs, run_job, finish_job, finish_failed_job, the pool
    property): arq is pinned to 0.28.*, and every worker test runs under both worker kinds.
    """

    def __init__(self, *, hooks: Hooks, names: EngineNames, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hooks = hooks
        self._names = names
        self.ctx[CTX_COMMIT_IN_FINISH] = True

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
                claim = _CLAIM([self._names.in_progress_key(job_id), self.queue_name], [now_ms(), ttl_ms, job_id])
                score = await run_script(self.pool, claim)
            except BaseException:
                # arq's own claim leaks the slot here; ours gives it back on any error.
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
        start = START_PIGGYBACK.get()
        if start is not None and not start.sent:
            return cast(ArqRedis, _PoolWithStart(base, start))
        call = _FINISH_SCRIPT.get()
        return cast(ArqRedis, _PoolWithScript(base, call)) if call is not None else base

    async def run_job(self, job_id: str, score: int) -> None:
        # The start transition rides on arq's first transaction of the run (GET job, INCR
        # tries): one round trip less per job. If arq then drops the job before running it,
        # finish_failed_job ends the state.
        piggyback = self._hooks.start_piggyback(job_id)
        if piggyback is None:
            await super().run_job(job_id, score)
            return
        token = START_PIGGYBACK.set(piggyback)
        try:
            await super().run_job(job_id, score)
        finally:
            START_PIGGYBACK.reset(token)
            # Its outcome is written (finish_job waits for Redis) or left to recovery.
            self._hooks.release(job_id)

    async def finish_job(self, job_id: str, *args: Any) -> None:
        call = self._hooks.take_commit(job_id)
        await self._finish_with(job_id, call, lambda: super(FastWorker, self).finish_job(job_id, *args))

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        call = self._hooks.dropped_call(job_id, result_data)
        await self._finish_with(job_id, call, lambda: super(FastWorker, self).finish_failed_job(job_id, result_data))

    async def _finish_with(
        self, engine_id: str, call: ScriptCall | None, finish: Callable[[], Awaitable[None]]
    ) -> None:
        """arq's finish transaction with our outcome in front, sent until Redis takes it.

        arq would let a Redis error escape and lose the outcome while the worker lives on: here
        the worker keeps it (and the job's lease) and sends it again once Redis answers.
        """

        async def send() -> None:
            token = _FINISH_SCRIPT.set(call)
            try:
                await finish()
            except NoScriptError:
                # Redis lost our scripts (restart, SCRIPT FLUSH) while arq's part of EXEC went
                # through: send the outcome on its own, which loads the script again.
                if call is not None:
                    await self._hooks.send_alone(call)
            finally:
                _FINISH_SCRIPT.reset(token)

        try:
            await self._hooks.write_outcome(engine_id, send)
        except RedisError:
            # Not an outage (write_outcome handles those): log it and keep serving. What was not
            # written is found by the reconciler (state) or redelivered (arq's job).
            logger.exception("finishing a job failed; the reconciler will settle its state")


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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.stopping.wait(), delay_s)
            delay_s = min(_REDIS_RETRY_MAX_S, delay_s * 2)
