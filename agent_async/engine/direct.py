"""arq's run_job on its common path, for the jobs the fast worker's claim picked up.

arq's run_job starts each job's function as a second task under `asyncio.wait_for`, formats the
job's arguments for a log line we drop anyway (logs.EngineJobLineFilter), and asks Redis for the
job's record and tries in a pickup transaction, which the fast worker answers from a stand-in
pipeline. A job the claim picked up needs none of that: its record, tries and abort flag are in
the claim's reply (pickup.lua). `DirectRun` runs such a job in the task the worker made for it,
with arq's outcomes for each way a run ends (counts, Retry, abort, cancel, timeout) and arq's own
finish transaction. Whatever is off that path (no record, aborted before it started, a function
this worker does not have, tries past the limit, a cron tick, a function that keeps its result in
arq) goes to arq's run_job unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from arq.cron import CronJob
from arq.jobs import SerializationError, deserialize_job_raw
from arq.utils import ms_to_datetime, timestamp_ms
from arq.worker import Function, Retry, RetryJob, Worker

from agent_async.engine.claim import PickedUp

__all__ = ["DirectJob", "DirectRun"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DirectJob:
    """A picked-up job on the common path: its function and arguments, read from the claim's reply."""

    function: Function
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    enqueue_time_ms: int


class DirectRun(Worker):
    """The run of a picked-up job without arq's second task (mixed into the fast worker)."""

    def direct_job(self, picked: PickedUp) -> DirectJob | None:
        """The job to run directly, or None if arq's run_job must handle it (see the module doc)."""
        if picked.job is None or picked.aborted:
            return None
        try:
            name, args, kwargs, enqueue_try, enqueue_time_ms = deserialize_job_raw(
                picked.job, deserializer=self.job_deserializer
            )
        except SerializationError:
            return None
        function = self.functions.get(name)
        if function is None or isinstance(function, CronJob):
            return None
        max_tries = self.max_tries if function.max_tries is None else function.max_tries
        if (enqueue_try and enqueue_try > picked.tries) or picked.tries > max_tries or _keeps_result(self, function):
            return None
        return DirectJob(function, args, kwargs, enqueue_time_ms)

    async def run_direct(self, job_id: str, score: int, job: DirectJob, tries: int) -> None:
        """arq's run_job from its on_job_start on, with the function run in this task."""
        function = job.function
        ctx = {
            **self.ctx, "job_id": job_id, "job_try": tries, "enqueue_time": ms_to_datetime(job.enqueue_time_ms),
            "score": score,
        }
        if self.on_job_start:
            await self.on_job_start(ctx)
        timeout_s = self.job_timeout_s if function.timeout_s is None else function.timeout_s
        finish = False
        incr_score: int | None = None
        task = asyncio.current_task()
        assert task is not None  # run_job always runs as the worker's task of this job
        # arq's abort cancels the task in job_tasks: here it is this one, until the function ends.
        self.job_tasks[job_id] = task
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    await function.coroutine(ctx, *job.args, **job.kwargs)
            finally:
                del self.job_tasks[job_id]
        except (Exception, asyncio.CancelledError) as exc:
            if self.retry_jobs and isinstance(exc, Retry):
                incr_score = exc.defer_score
                if exc.defer_score:
                    incr_score = exc.defer_score + (timestamp_ms() - score)
                self.jobs_retried += 1
            elif job_id in self.aborting_tasks and isinstance(exc, asyncio.CancelledError):
                finish = True
                self.aborting_tasks.remove(job_id)
                self.jobs_failed += 1
                task.uncancel()  # the abort's cancel ends the function, not the finish below
            elif self.retry_jobs and isinstance(exc, (asyncio.CancelledError, RetryJob)):
                self.jobs_retried += 1  # a stop cancelled it: arq runs it again (finish left False)
            else:
                logger.exception("job %s: %s failed in the engine", job_id, function.name)
                finish = True
                self.jobs_failed += 1
        else:
            finish = True
            self.jobs_complete += 1
        if self.on_job_end:
            await self.on_job_end(ctx)
        await asyncio.shield(self.finish_run(job_id, finish, incr_score))

    async def finish_run(self, job_id: str, done: bool, requeue_ms: int | None) -> None:
        """arq's finish of a run (the fast worker writes the outcome with it). No result to store
        in arq (direct_job checked): our outcome is in the JobState."""
        await self.finish_job(job_id, done, None, 0, False, requeue_ms, None)


def _keeps_result(worker: Worker, function: Function) -> bool:
    """Whether arq would store this function's result (ours keep none: keep_result=0)."""
    keep_forever = worker.keep_result_forever if function.keep_result_forever is None else function.keep_result_forever
    keep_s = worker.keep_result_s if function.keep_result_s is None else function.keep_result_s
    return bool(keep_forever or keep_s > 0)
