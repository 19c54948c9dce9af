"""mysvc.report.build: sums a range of numbers in a child process, so a cancel can always stop it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agent_async import Job, JobRequest, agent_job, run_in_child


def sum_of_squares(count: int) -> int:
    """CPU-bound work: module-level, so run_in_child can pickle it by name."""
    return sum(n * n for n in range(count))


@dataclass
class BuildReport(JobRequest):
    name: ClassVar[str] = "mysvc.report.build"
    soft_timeout_seconds: ClassVar[float] = 30
    max_concurrent: ClassVar[int] = 4

    title: str = ""
    count: int = 1000


@agent_job
class BuildReportJob(Job[BuildReport]):
    request_class = BuildReport

    async def process(self, request: BuildReport, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        total = await run_in_child(sum_of_squares, request.count)
        return {"title": request.title, "total": total}
