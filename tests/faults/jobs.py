"""Jobs for the fault-injection suite: short runs with an idempotent side effect keyed by job id."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any, ClassVar

from redis.exceptions import ConnectionError as RedisConnectionError

from agent_async import GroupFinalizer, Job, JobRequest, agent_job, run_in_child


def effects_key(namespace: str) -> str:
    return f"{namespace}:faults:effects"


def runs_key(namespace: str) -> str:
    return f"{namespace}:faults:runs"


async def work_then_upsert(job: Job[Any], job_id: str, duration_s: float) -> dict[str, Any]:
    redis = job.resources.redis
    namespace = job.resources.namespace
    await redis.hincrby(runs_key(namespace), job_id, 1)
    await asyncio.sleep(duration_s)
    # The side effect: an upsert keyed by job id, so a re-run cannot duplicate it.
    await redis.hset(effects_key(namespace), job_id, "done")
    return {"slept_s": duration_s}


@dataclass
class ResumeUpsert(JobRequest):
    name: ClassVar[str] = "faults.resume_upsert"
    resume: ClassVar[bool] = True
    max_try: ClassVar[int] = 12  # more than the 10 kills: a job may be hit by several
    # Its own Redis write fails while Redis restarts: a transient error, retried. (Before outcomes
    # were kept through an outage, such a failure was lost with its outcome and the job re-run.)
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (RedisConnectionError,)
    max_concurrent: ClassVar[int] = 1000
    soft_timeout_seconds: ClassVar[float] = 5
    duration_s: float = 0.02


@agent_job
class ResumeUpsertJob(Job[ResumeUpsert]):
    request_class = ResumeUpsert

    async def process(self, request: ResumeUpsert, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return await work_then_upsert(self, job_id, request.duration_s)


@dataclass
class OnceUpsert(JobRequest):
    name: ClassVar[str] = "faults.once_upsert"
    resume: ClassVar[bool] = False
    max_concurrent: ClassVar[int] = 1000
    soft_timeout_seconds: ClassVar[float] = 5
    duration_s: float = 0.02


@agent_job
class OnceUpsertJob(Job[OnceUpsert]):
    request_class = OnceUpsert

    async def process(self, request: OnceUpsert, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return await work_then_upsert(self, job_id, request.duration_s)


def burn_cpu_ignoring_sigterm(seconds: float, marker_path: str) -> None:
    import os
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(marker_path, "w") as marker:
        marker.write(str(os.getpid()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


@dataclass
class Blocking(JobRequest):
    name: ClassVar[str] = "faults.blocking"
    seconds: float = 60.0
    marker_path: str = ""


@agent_job
class BlockingJob(Job[Blocking]):
    request_class = Blocking

    async def process(self, request: Blocking, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await self.resources.redis.hincrby(runs_key(self.resources.namespace), job_id, 1)
        await run_in_child(burn_cpu_ignoring_sigterm, request.seconds, request.marker_path)
        return {}


def random_duration(rng: random.Random) -> float:
    return rng.uniform(0.01, 0.08)


@dataclass
class CountThenSleep(JobRequest):
    """Counts its run at the start, then works without touching Redis: its outcome can be due while
    Redis is down."""

    name: ClassVar[str] = "faults.count_then_sleep"
    resume: ClassVar[bool] = False
    max_concurrent: ClassVar[int] = 1000
    soft_timeout_seconds: ClassVar[float] = 10
    duration_s: float = 0.5


@agent_job
class CountThenSleepJob(Job[CountThenSleep]):
    request_class = CountThenSleep

    async def process(self, request: CountThenSleep, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await self.resources.redis.hincrby(runs_key(self.resources.namespace), job_id, 1)
        await asyncio.sleep(request.duration_s)
        return {"slept_s": request.duration_s}


def finals_key(namespace: str) -> str:
    return f"{namespace}:faults:finals"


@dataclass
class FanoutFinal(GroupFinalizer):
    """Records the group's counts once per run (a SIGKILL during it re-runs it: resume)."""

    name: ClassVar[str] = "faults.fanout_final"
    resume: ClassVar[bool] = True
    max_try: ClassVar[int] = 12


@agent_job
class FanoutFinalJob(Job[FanoutFinal]):
    request_class = FanoutFinal

    async def process(self, request: FanoutFinal, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        view = await self.resources.groups.get(request.group_id)
        assert view is not None
        counts = {"succeeded": view.succeeded, "failed": view.failed, "canceled": view.canceled}
        await self.resources.redis.hset(finals_key(self.resources.namespace), job_id, json.dumps(counts))
        return counts
