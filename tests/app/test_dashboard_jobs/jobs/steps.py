"""A job that reports progress step by step, slowly enough for a browser to see the bar move."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

from agent_async import Job, JobRequest, agent_job, report_progress

STEPS = "tests.dashboard.steps"


@dataclass
class Steps(JobRequest):
    name: ClassVar[str] = STEPS
    steps: int = 4
    pause_s: float = 0.6  # above the 0.25 s progress coalescing: every step is written and sent


@agent_job
class StepsJob(Job[Steps]):
    request_class = Steps

    async def process(self, request: Steps, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        for step in range(1, request.steps + 1):
            await asyncio.sleep(request.pause_s)
            await report_progress(step / request.steps, f"step {step} of {request.steps}")
        return {"steps": request.steps}
