"""faults.svc.sleep: sleeps without touching Redis, then returns."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

from agent_async import Job, JobRequest, agent_job


@dataclass
class Sleep(JobRequest):
    name: ClassVar[str] = "faults.svc.sleep"
    soft_timeout_seconds: ClassVar[float] = 30
    duration_s: float = 1.0


@agent_job
class SleepJob(Job[Sleep]):
    request_class = Sleep

    async def process(self, request: Sleep, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await asyncio.sleep(request.duration_s)
        return {"slept_s": request.duration_s}
