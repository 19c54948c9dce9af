"""The worker side: runs attempts (runner, child processes), keeps leases and cancels, recovers orphans."""

from __future__ import annotations

from agent_async.worker.child import ChildProcessLost, RunHandle, run_in_child
from agent_async.worker.recovery import JobRecovery
from agent_async.worker.runner import Backoff, JobContextFactory, JobRunner, StopPolicy
from agent_async.worker.runtime import WorkerRuntime
from agent_async.worker.service import WorkerService

__all__ = [
    "Backoff",
    "ChildProcessLost",
    "JobContextFactory",
    "JobRecovery",
    "JobRunner",
    "RunHandle",
    "StopPolicy",
    "WorkerRuntime",
    "WorkerService",
    "run_in_child",
]
