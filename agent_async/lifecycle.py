"""The job lifecycle: statuses, the terminal set, the resume rule, error kinds and attempt outcomes.

Written once here; the store's Lua scripts receive the statuses and error kinds from this module
(see `lua_constants`) instead of spelling them again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_async.request import JobRequest
    from agent_async.settings import AgentSettings

__all__ = [
    "ACTIVE",
    "TERMINAL",
    "ErrorKind",
    "JobStatus",
    "Outcome",
    "StartDecision",
    "attempt_budget_s",
    "dropped_outcome",
    "interrupted_outcome",
    "lua_constants",
    "may_resume",
    "now_ms",
]


class JobStatus(StrEnum):
    PENDING = "PENDING"
    STARTED = "STARTED"
    RETRY = "RETRY"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    CANCELED = "CANCELED"


TERMINAL: frozenset[JobStatus] = frozenset({JobStatus.SUCCESS, JobStatus.FAILURE, JobStatus.CANCELED})
ACTIVE: frozenset[JobStatus] = frozenset(JobStatus) - TERMINAL


class ErrorKind(StrEnum):
    """Why the layer itself ended (or re-queued) an attempt; a job's error starts with `<kind>: `."""

    WORKER_LOST = "WorkerLost"
    WORKER_SHUTDOWN = "WorkerShutdown"
    SOFT_TIME_LIMIT = "SoftTimeLimitExceeded"
    HARD_TIME_LIMIT = "HardTimeLimitExceeded"
    ACCESS_REVOKED = "AccessRevoked"

    def describe(self, detail: str) -> str:
        return f"{self.value}: {detail}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def may_resume(*, resume: bool, attempts: int, max_try: int) -> bool:
    """Whether an attempt cut short (worker lost or shut down) may run again.

    The same rule is `may_resume` in store/lua/lib.lua, which applies it inside the scripts.
    """
    return resume and attempts < max_try


# Room for the runner's last wait after phase 2 (children killed, task abandoned).
_AFTER_KILL_MARGIN_S = 2.0


def attempt_budget_s(request_class: type[JobRequest], settings: AgentSettings) -> float:
    """Soft limit + the longer grace + a margin: no attempt outlives it in a live worker."""
    grace_s = max(settings.hard_timeout_grace_s, settings.cancel_grace_s)
    return request_class.soft_timeout_seconds + grace_s + _AFTER_KILL_MARGIN_S


@dataclass(frozen=True, slots=True)
class StartDecision:
    """What the start transition decided for one delivery of a job."""

    run: bool
    attempts: int = 0
    user_uid: str | None = None
    name: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended: SUCCESS, FAILURE, CANCELED, PENDING (handed back) or RETRY."""

    status: JobStatus
    result: dict[str, Any] | None = None
    error: str | None = None
    retry_in_s: float = 0.0


def interrupted_outcome(request_class: type[JobRequest] | None, attempts: int) -> Outcome:
    """An attempt the engine cancelled itself: a worker shutdown past its drain time.

    The engine puts the job back in its queue; whether it may run again is the resume rule.
    """
    if request_class is not None and may_resume(
        resume=request_class.resume, attempts=attempts, max_try=request_class.max_try
    ):
        return Outcome(JobStatus.PENDING, error="interrupted by worker shutdown; queued again")
    why = "resume is off" if request_class is None or not request_class.resume else "no attempts left"
    error = ErrorKind.WORKER_SHUTDOWN.describe(f"interrupted by worker shutdown ({why})")
    return Outcome(JobStatus.FAILURE, error=error)


def dropped_outcome(reason: str | None, *, canceled: bool = False) -> Outcome:
    """The end of a job the engine dropped without running it to the end (no hook saw it)."""
    reason = reason or "its queued job disappeared (expired or deleted)"
    status = JobStatus.CANCELED if canceled else JobStatus.FAILURE
    return Outcome(status, error=f"dropped by the queue engine: {reason}")


def lua_constants() -> dict[str, str]:
    """Placeholders the store's Lua files use, and their values (substituted when loaded)."""
    return {
        # A Lua table constructor's entries: the set lib.lua's is_terminal looks a status up in.
        "@TERMINAL_SET@": ",".join(f"['{s.value}']=true" for s in sorted(TERMINAL)),
        "@WORKER_LOST@": ErrorKind.WORKER_LOST.value,
    }
