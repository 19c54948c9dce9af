"""JobRunner: runs one attempt of a Job and turns whatever happens into an Outcome."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from agent_async import codec
from agent_async.errors import SoftTimeLimitExceeded
from agent_async.job import Job
from agent_async.state import JobStatus

__all__ = ["Backoff", "JobContextFactory", "JobRunner", "Outcome"]

logger = logging.getLogger(__name__)

JobContextFactory = Callable[[], AbstractAsyncContextManager[Any]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended: SUCCESS, FAILURE, or RETRY after `retry_in_s`."""

    status: JobStatus
    result: dict[str, Any] | None = None
    error: str | None = None
    retry_in_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: base * 2**(attempt-1), capped, times a factor in [0.5, 1]."""

    base_s: float
    max_s: float

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        ceiling = min(self.max_s, self.base_s * 2.0 ** max(0, attempt - 1))
        # Jitter spreads a burst of failures so retries do not hit a recovering service at once.
        return ceiling * (rng or random).uniform(0.5, 1.0)


class JobRunner:
    """Runs `Job.process` under the soft time limit and classifies the result or exception."""

    def __init__(self, job: Job, *, backoff: Backoff, context: JobContextFactory | None = None) -> None:
        self.job = job
        self.request_class = job.request_class
        self.backoff = backoff
        self._context = context

    async def run(self, payload: dict[str, Any], *, job_id: str, user_uid: str | None, attempt: int) -> Outcome:
        soft_s = float(self.request_class.soft_timeout_seconds)
        try:
            async with self._context() if self._context else nullcontext():
                async with asyncio.timeout(soft_s) as limit:
                    result = await self.job.process(payload, user_uid=user_uid, job_id=job_id)
        except TimeoutError as exc:
            if limit.expired():
                return self._failed(SoftTimeLimitExceeded(f"soft time limit of {soft_s:g}s exceeded"), attempt)
            return self._failed(exc, attempt)
        except Exception as exc:
            return self._failed(exc, attempt)
        return self._succeeded(result)

    def _succeeded(self, result: object) -> Outcome:
        if result is None:
            result = {}
        try:
            if not isinstance(result, dict):
                raise ValueError(f"result is a {type(result).__name__}, expected a dict")
            codec.check_json_safe(result, "result")
        except ValueError as exc:
            return Outcome(JobStatus.FAILURE, error=f"process() returned an invalid result: {exc}")
        return Outcome(JobStatus.SUCCESS, result=result)

    def _failed(self, exc: BaseException, attempt: int) -> Outcome:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        retryable = isinstance(exc, self.request_class.retry_for)
        if retryable and attempt < self.request_class.max_try:
            delay_s = self.backoff.delay_s(attempt)
            logger.info("job %s attempt %d failed (%s); retry in %.2fs",
                        self.request_class.name, attempt, error, delay_s)
            return Outcome(JobStatus.RETRY, error=error, retry_in_s=delay_s)
        if retryable:
            error = f"{error} (gave up after {attempt} attempts)"
        logger.warning("job %s failed: %s", self.request_class.name, error, exc_info=exc)
        return Outcome(JobStatus.FAILURE, error=error)
