"""Job declarations shared by the tests. Each records its runs in Redis, under the test's namespace."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agent_async import Job, JobRequest, SoftTimeLimitExceeded, agent_job, run_in_child


async def record_run(job: Job[Any], job_id: str) -> int:
    """Count one run of `job_id`; returns how many times it has run so far."""
    return int(await job.resources.redis.hincrby(runs_key(job.resources.namespace), job_id, 1))


def runs_key(namespace: str) -> str:
    return f"{namespace}:test:runs"


@dataclass
class Echo(JobRequest):
    name: ClassVar[str] = "tests.echo"
    text: str = ""
    numbers: list[int] = field(default_factory=list)


@agent_job
class EchoJob(Job[Echo]):
    request_class = Echo

    async def process(self, request: Echo, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        return {"echo": request.text, "sum": sum(request.numbers), "user": user_uid}


@dataclass
class Flaky(JobRequest):
    """Fails with ValueError (retryable) on its first `fail_times` runs."""

    name: ClassVar[str] = "tests.flaky"
    max_try: ClassVar[int] = 3
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (ValueError,)
    fail_times: int = 1


@agent_job
class FlakyJob(Job[Flaky]):
    request_class = Flaky

    async def process(self, request: Flaky, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        runs = await record_run(self, job_id)
        if runs <= request.fail_times:
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
class BoomJob(Job[Boom]):
    request_class = Boom

    async def process(self, request: Boom, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        raise RuntimeError("boom: not retryable")


@dataclass
class Slow(JobRequest):
    name: ClassVar[str] = "tests.slow"
    soft_timeout_seconds: ClassVar[float] = 0.2
    max_concurrent: ClassVar[int] = 1
    sleep_s: float = 1.0


@agent_job
class SlowJob(Job[Slow]):
    request_class = Slow

    async def process(self, request: Slow, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        try:
            await asyncio.sleep(request.sleep_s)
        except asyncio.CancelledError:
            # The soft limit lets the job clean up: prove it ran.
            await self.resources.redis.hset(runs_key(self.resources.namespace) + ":cleanup", job_id, 1)
            raise
        return {"slept": request.sleep_s}


@dataclass
class SlowRetried(JobRequest):
    name: ClassVar[str] = "tests.slow_retried"
    soft_timeout_seconds: ClassVar[float] = 0.1
    max_try: ClassVar[int] = 2
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (SoftTimeLimitExceeded,)


@agent_job
class SlowRetriedJob(Job[SlowRetried]):
    request_class = SlowRetried

    async def process(self, request: SlowRetried, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        await asyncio.sleep(1)
        return {}


@dataclass
class Gated(JobRequest):
    name: ClassVar[str] = "tests.gated"
    max_concurrent: ClassVar[int] = 1


@agent_job
class GatedJob(Job[Gated]):
    request_class = Gated

    async def process(self, request: Gated, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        return {"ok": True}


@dataclass
class GatedFive(JobRequest):
    name: ClassVar[str] = "tests.gated5"
    max_concurrent: ClassVar[int] = 5


@agent_job
class GatedFiveJob(Job[GatedFive]):
    request_class = GatedFive

    async def process(self, request: GatedFive, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        return {}


@dataclass
class BadResult(JobRequest):
    name: ClassVar[str] = "tests.bad_result"


@agent_job
class BadResultJob(Job[BadResult]):
    request_class = BadResult

    async def process(self, request: BadResult, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
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
class AmnesiaJob(Job[Amnesia]):
    request_class = Amnesia

    async def process(self, request: Amnesia, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        await self.resources.redis.script_flush()
        return {"remembered": True}


def spin_forever(marker_path: str) -> None:
    """Blocking work that ignores SIGTERM: only SIGKILL stops it (runs in a child process)."""
    import os
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(marker_path, "w") as marker:
        marker.write(str(os.getpid()))
    while True:
        time.sleep(0.01)


def add(a: int, b: int) -> int:
    return a + b


@dataclass
class Stubborn(JobRequest):
    """Runs blocking work in a killable child process that ignores polite termination."""

    name: ClassVar[str] = "tests.stubborn"
    max_concurrent: ClassVar[int] = 1
    marker_path: str = ""


@agent_job
class StubbornJob(Job[Stubborn]):
    request_class = Stubborn

    async def process(self, request: Stubborn, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await record_run(self, job_id)
        await run_in_child(spin_forever, request.marker_path)
        return {}


@dataclass
class ChildSum(JobRequest):
    name: ClassVar[str] = "tests.child_sum"


@agent_job
class ChildSumJob(Job[ChildSum]):
    request_class = ChildSum

    async def process(self, request: ChildSum, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return {"sum": await run_in_child(add, 2, 3)}


@dataclass
class Deaf(JobRequest):
    """An async job that swallows cancellation: it can only be abandoned."""

    name: ClassVar[str] = "tests.deaf"
    soft_timeout_seconds: ClassVar[float] = 0.3


@agent_job
class DeafJob(Job[Deaf]):
    request_class = Deaf

    async def process(self, request: Deaf, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        # Deaf from its first step: a test that saw this record may cancel before its reply is back
        # here, and that cancel is ignored like the later ones.
        with contextlib.suppress(asyncio.CancelledError):
            await record_run(self, job_id)
        # 2.5 s: past its hard limit (soft 0.3 s + the tests' 0.5 s grace + 1 s), then it ends.
        for _ in range(25):
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                continue
        return {}


@dataclass
class Resumable(JobRequest):
    name: ClassVar[str] = "tests.resumable"
    resume: ClassVar[bool] = True
    max_try: ClassVar[int] = 2
    max_concurrent: ClassVar[int] = 3


@agent_job
class ResumableJob(Job[Resumable]):
    request_class = Resumable

    async def process(self, request: Resumable, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return {"runs": await record_run(self, job_id)}


@dataclass
class NotResumable(JobRequest):
    name: ClassVar[str] = "tests.not_resumable"
    max_try: ClassVar[int] = 3
    max_concurrent: ClassVar[int] = 3


@agent_job
class NotResumableJob(Job[NotResumable]):
    request_class = NotResumable

    async def process(self, request: NotResumable, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return {"runs": await record_run(self, job_id)}


@dataclass
class Sleeper(JobRequest):
    """Sleeps cooperatively; records that its clean-up ran when cancelled."""

    name: ClassVar[str] = "tests.sleeper"
    max_concurrent: ClassVar[int] = 2
    sleep_s: float = 30.0


@agent_job
class SleeperJob(Job[Sleeper]):
    request_class = Sleeper

    async def process(self, request: Sleeper, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        try:
            # Inside the try: a test that waits for this count knows a cancel reaches the finally.
            await record_run(self, job_id)
            await asyncio.sleep(request.sleep_s)
        finally:
            await self.resources.redis.hset(runs_key(self.resources.namespace) + ":cleanup", job_id, 1)
        return {"slept": request.sleep_s}


@dataclass
class Ticking(JobRequest):
    """A schedule firing every minute, one run at a time."""

    name: ClassVar[str] = "tests.ticking"
    cron: ClassVar[str | None] = "* * * * *"
    max_concurrent: ClassVar[int] = 1


@agent_job
class TickingJob(Job[Ticking]):
    request_class = Ticking

    async def process(self, request: Ticking, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return {"runs": await record_run(self, job_id)}


@dataclass
class Nightly(JobRequest):
    name: ClassVar[str] = "tests.nightly"
    cron: ClassVar[str | None] = "0 3 13 * fri"


@agent_job
class NightlyJob(Job[Nightly]):
    request_class = Nightly

    async def process(self, request: Nightly, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return {}
