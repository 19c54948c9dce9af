"""Job declarations shared by the tests. Each records its runs in Redis, under the test's namespace."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agent_async import Job, JobRequest, SoftTimeLimitExceeded, agent_job


async def record_run(job: Job, job_id: str) -> int:
    """Count one run of `job_id`; returns how many times it has run so far."""
    return int(await job.agent.redis.hincrby(runs_key(job.agent.keys.namespace), job_id, 1))


def runs_key(namespace: str) -> str:
    return f"{namespace}:test:runs"


@dataclass
class Echo(JobRequest):
    name: ClassVar[str] = "tests.echo"
    text: str = ""
    numbers: list[int] = field(default_factory=list)


@agent_job
class EchoJob(Job):
    request_class = Echo

    async def process(self, payload: dict[str, Any], *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        return {"echo": payload["text"], "sum": sum(payload["numbers"]), "user": user_uid}


@dataclass
class Flaky(JobRequest):
    """Fails with ValueError (retryable) on its first `fail_times` runs."""

    name: ClassVar[str] = "tests.flaky"
    max_try: ClassVar[int] = 3
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (ValueError,)
    fail_times: int = 1


@agent_job
class FlakyJob(Job):
    request_class = Flaky

    async def process(self, payload: dict[str, Any], *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        runs = await record_run(self, job_id)
        if runs <= payload["fail_times"]:
            raise ValueError(f"flaky failure #{runs}")
        return {"runs": runs}


@dataclass
class Boom(JobRequest):
    """Raises an exception that is not in retry_for."""

    name: ClassVar[str] = "tests.boom"
    max_try: ClassVar[int] = 3
    max_concurrent: ClassVar[int] = 2
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (ValueError,)


@agent_job
class BoomJob(Job):
    request_class = Boom

    async def process(self, payload: dict[str, Any], *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        raise RuntimeError("boom: not retryable")


@dataclass
class Slow(JobRequest):
    name: ClassVar[str] = "tests.slow"
    soft_timeout_seconds: ClassVar[float] = 0.2
    max_concurrent: ClassVar[int] = 1
    sleep_s: float = 1.0


@agent_job
class SlowJob(Job):
    request_class = Slow

    async def process(self, payload: dict[str, Any], *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        try:
            await asyncio.sleep(payload["sleep_s"])
        except asyncio.CancelledError:
            # The soft limit lets the job clean up: prove it ran.
            await self.agent.redis.hset(runs_key(self.agent.keys.namespace) + ":cleanup", job_id, 1)
            raise
        return {"slept": payload["sleep_s"]}


@dataclass
class SlowRetried(JobRequest):
    name: ClassVar[str] = "tests.slow_retried"
    soft_timeout_seconds: ClassVar[float] = 0.1
    max_try: ClassVar[int] = 2
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (SoftTimeLimitExceeded,)


@agent_job
class SlowRetriedJob(Job):
    request_class = SlowRetried

    async def process(self, payload: dict[str, Any], *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        await asyncio.sleep(1)
        return {}


@dataclass
class Gated(JobRequest):
    name: ClassVar[str] = "tests.gated"
    max_concurrent: ClassVar[int] = 1


@agent_job
class GatedJob(Job):
    request_class = Gated

    async def process(self, payload: dict[str, Any], *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        return {"ok": True}


@dataclass
class GatedFive(JobRequest):
    name: ClassVar[str] = "tests.gated5"
    max_concurrent: ClassVar[int] = 5


@agent_job
class GatedFiveJob(Job):
    request_class = GatedFive

    async def process(self, payload: dict[str, Any], *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        return {}


@dataclass
class BadResult(JobRequest):
    name: ClassVar[str] = "tests.bad_result"


@agent_job
class BadResultJob(Job):
    request_class = BadResult

    async def process(self, payload: dict[str, Any], *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return {"when": object()}


@dataclass
class NoWorker(JobRequest):
    """A request no worker can run (its Job is never registered): arq drops it as unknown."""

    name: ClassVar[str] = "tests.no_worker"
    max_concurrent: ClassVar[int] = 1


@dataclass
class Amnesia(JobRequest):
    """Makes Redis forget every Lua script mid-run, as a Redis restart would."""

    name: ClassVar[str] = "tests.amnesia"


@agent_job
class AmnesiaJob(Job):
    request_class = Amnesia

    async def process(self, payload: dict[str, Any], *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        await self.agent.redis.script_flush()
        return {"remembered": True}
