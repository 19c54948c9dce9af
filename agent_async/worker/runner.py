"""JobRunner: runs one attempt of a Job under its time limits and cancellation, returns an Outcome."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from agent_async.errors import AccessRevoked, RequestRefusedError, SoftTimeLimitExceeded
from agent_async.job import Job
from agent_async.lifecycle import ErrorKind, JobStatus, Outcome
from agent_async.request import JobRequest
from agent_async.store import codec
from agent_async.worker.child import RunHandle, current_run

__all__ = ["Backoff", "JobContextFactory", "JobRunner", "StopPolicy"]

logger = logging.getLogger(__name__)

JobContextFactory = Callable[[], AbstractAsyncContextManager[Any]]

# After phase 2 (children killed) a task gets this long to finish before it is abandoned.
_AFTER_KILL_WAIT_S = 1.0
_CHILD_EXIT_POLL_S = 0.05
# The `outcome` of a run's end line when the worker itself stopped it (its state is decided by the
# resume rule afterwards), and the `error_type` of a result that is not a JSON object.
_INTERRUPTED = "INTERRUPTED"
_INVALID_RESULT = "InvalidResult"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: base * 2**(attempt-1), capped, times a factor in [0.5, 1]."""

    base_s: float
    max_s: float

    def delay_s(self, attempt: int, rng: random.Random | None = None, *, at_least_s: float = 0.0) -> float:
        """The pause before attempt + 1; never under `at_least_s` (what the failure asked for,
        e.g. a server's Retry-After), which is itself capped at `max_s`."""
        ceiling = min(self.max_s, self.base_s * 2.0 ** max(0, attempt - 1))
        # Jitter spreads a burst of failures so retries do not hit a recovering service at once.
        return max(min(at_least_s, self.max_s), ceiling * (rng or random).uniform(0.5, 1.0))


def retry_after_of(exc: BaseException) -> float:
    """The least pause a failure asks for before its retry: its `retry_after_s` attribute when it
    has one that is a finite number >= 0 (ConnectionCoolingDown's cooldown, an HTTP Retry-After
    an application carries over), else 0."""
    value = getattr(exc, "retry_after_s", None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return 0.0
    return float(value)


@dataclass(frozen=True, slots=True)
class StopPolicy:
    """Grace periods between the cooperative stop (phase 1) and the hard one (phase 2)."""

    hard_timeout_grace_s: float
    cancel_grace_s: float


class JobRunner:
    """Runs `Job.process` as its own task and watches it.

    Three things can stop an attempt before it returns: a cancel request, the soft time limit, or
    (if the job ignores phase 1) the end of the grace period. Phase 1 cancels the task so
    `process()` can clean up in `finally`; phase 2 SIGKILLs the attempt's child processes (see
    `run_in_child`) and, if the task still runs, abandons it so the worker is never blocked.
    """

    def __init__(
        self,
        job: Job[Any],
        *,
        backoff: Backoff,
        stop: StopPolicy,
        context: JobContextFactory | None = None,
    ) -> None:
        self.job = job
        self.request_class = job.request_class
        self.backoff = backoff
        self.stop = stop
        self._context = context

    async def run(
        self, payload: dict[str, Any], *, job_id: str, user_uid: str | None, attempt: int, handle: RunHandle
    ) -> Outcome:
        # One start and one end line per run; the run's fields (job_id, job, user_uid, attempt)
        # are bound by the caller (agent_async.engine.hooks), never the payload or the result.
        started_s = time.perf_counter()
        logger.info("job started")
        try:
            ended = await self._attempt(payload, job_id=job_id, user_uid=user_uid, attempt=attempt, handle=handle)
        except asyncio.CancelledError:
            _log_finished(started_s, _INTERRUPTED, ErrorKind.WORKER_SHUTDOWN.value)
            raise
        _log_finished(started_s, ended.outcome.status.value, ended.error_type)
        return ended.outcome

    async def _attempt(
        self, payload: dict[str, Any], *, job_id: str, user_uid: str | None, attempt: int, handle: RunHandle
    ) -> _Ended:
        try:
            request = self.request_class.from_payload(payload)
        except RequestRefusedError as exc:
            # The stored payload no longer builds the request (its fields changed since it was
            # queued): no retry can fix that.
            error = f"the payload does not fit {self.request_class.__name__}: {exc}"
            return _Ended(Outcome(JobStatus.FAILURE, error=error), type(exc).__name__)
        token = current_run.set(handle)
        try:
            task = asyncio.create_task(self._process(request, job_id, user_uid), name=f"job {job_id}")
        finally:
            current_run.reset(token)
        try:
            return await self._supervise(task, handle, attempt)
        except asyncio.CancelledError:
            # The worker itself is stopping (shutdown): take the attempt down with it.
            task.cancel()
            handle.kill_children()
            raise

    async def _process(self, request: JobRequest, job_id: str, user_uid: str | None) -> dict[str, Any]:
        async with self._context() if self._context else nullcontext():
            if user_uid is not None:
                # Inside the attempt, so its time limit and a cancel apply to it too.
                await self.job.authorize(request, user_uid=user_uid, job_id=job_id)
            return await self.job.process(request, user_uid=user_uid, job_id=job_id)

    async def _supervise(self, task: asyncio.Task[dict[str, Any]], handle: RunHandle, attempt: int) -> _Ended:
        soft_s = float(self.request_class.soft_timeout_seconds)
        await _first_of(task, handle, soft_s)
        if task.done() and not handle.cancel_requested:
            return self._finished(task, attempt)
        canceled = handle.cancel_requested
        grace_s = self.stop.cancel_grace_s if canceled else self.stop.hard_timeout_grace_s
        why = "cancel requested" if canceled else f"soft time limit of {soft_s:g}s exceeded"
        phase = await self._stop(task, handle, why, grace_s)
        if canceled:
            return _Ended(Outcome(JobStatus.CANCELED, error=f"canceled while running ({phase})"))
        if phase == "stopped cooperatively":
            return self._failed(SoftTimeLimitExceeded(why), attempt)
        hard_s = soft_s + grace_s
        error = ErrorKind.HARD_TIME_LIMIT.describe(f"hard time limit of {hard_s:g}s exceeded ({phase})")
        return _Ended(Outcome(JobStatus.FAILURE, error=error), ErrorKind.HARD_TIME_LIMIT.value)

    async def _stop(self, task: asyncio.Task[Any], handle: RunHandle, why: str, grace_s: float) -> str:
        """Phase 1, then phase 2 if needed; says which one ended the attempt."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        if not task.done():
            task.cancel(why)
            await asyncio.wait({task}, timeout=grace_s)
        # Cancelling run_in_child sent SIGTERM: its child gets the rest of the grace to exit.
        for _ in range(int(grace_s / _CHILD_EXIT_POLL_S) + 1):
            if not handle.live_children() or loop.time() >= deadline:
                break
            await asyncio.sleep(_CHILD_EXIT_POLL_S)
        if task.done() and not handle.live_children():
            _consume(task)
            return "stopped cooperatively"
        killed = handle.kill_children()
        await asyncio.wait({task}, timeout=_AFTER_KILL_WAIT_S)
        if task.done():
            _consume(task)
            return f"stopped hard after {grace_s:g}s: {killed} child process(es) killed"
        logger.error("job %s ignores cancellation after %.1fs; abandoning its task", handle.job_id, grace_s)
        task.add_done_callback(_consume)
        return f"abandoned after {grace_s:g}s: the job ignores cancellation"

    def _finished(self, task: asyncio.Task[dict[str, Any]], attempt: int) -> _Ended:
        if task.cancelled():
            # process() cancelled itself (or awaited something that was): treat as a failure.
            return self._failed(asyncio.CancelledError("process() was cancelled"), attempt)
        exc = task.exception()
        if exc is not None:
            return self._failed(exc, attempt)
        return self._succeeded(task.result())

    def _succeeded(self, result: object) -> _Ended:
        if result is None:
            result = {}
        try:
            if not isinstance(result, dict):
                raise ValueError(f"result is a {type(result).__name__}, expected a dict")
            codec.check_json_safe(result, "result")
        except ValueError as exc:
            error = f"process() returned an invalid result: {exc}"
            return _Ended(Outcome(JobStatus.FAILURE, error=error), _INVALID_RESULT)
        return _Ended(Outcome(JobStatus.SUCCESS, result=result))

    def _failed(self, exc: BaseException, attempt: int) -> _Ended:
        kind = type(exc).__name__
        if isinstance(exc, AccessRevoked):
            error = ErrorKind.ACCESS_REVOKED.describe(str(exc) or "access revoked")
            return _Ended(Outcome(JobStatus.CANCELED, error=error), ErrorKind.ACCESS_REVOKED.value)
        error = f"{kind}: {exc}" if str(exc) else kind
        retryable = isinstance(exc, self.request_class.retry_for)
        if retryable and attempt < self.request_class.max_try:
            delay_s = self.backoff.delay_s(attempt, at_least_s=retry_after_of(exc))
            logger.info("job %s attempt %d failed (%s); retry in %.2fs",
                        self.request_class.name, attempt, error, delay_s)
            return _Ended(Outcome(JobStatus.RETRY, error=error, retry_in_s=delay_s), kind)
        if retryable:
            error = f"{error} (gave up after {attempt} attempts)"
        logger.warning("job %s failed: %s", self.request_class.name, error, exc_info=exc)
        return _Ended(Outcome(JobStatus.FAILURE, error=error), kind)


@dataclass(frozen=True, slots=True)
class _Ended:
    """An attempt's outcome, and what ended it for the log (an exception's class name or an
    ErrorKind; never its message, which may quote the payload)."""

    outcome: Outcome
    error_type: str | None = None


def _log_finished(started_s: float, outcome: str, error_type: str | None) -> None:
    duration_s = round(time.perf_counter() - started_s, 6)
    extra: dict[str, object] = {"duration_s": duration_s, "outcome": outcome}
    if error_type is not None:
        extra["error_type"] = error_type
    logger.info("job finished", extra=extra)


async def _first_of(task: asyncio.Task[Any], handle: RunHandle, timeout_s: float) -> None:
    """Wait until the task ends, a cancel is requested, or the timeout passes.

    A hand-made asyncio.wait: it runs once per job, and asyncio.wait plus a task waiting on an
    Event cost several times more.
    """
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(*_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    if handle.cancel_requested:
        return
    task.add_done_callback(wake)
    handle.waker = wake
    timer = loop.call_later(timeout_s, wake)
    try:
        await waiter
    finally:
        timer.cancel()
        task.remove_done_callback(wake)
        handle.waker = None


def _consume(task: asyncio.Task[Any]) -> None:
    """Retrieve a stopped task's exception so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
