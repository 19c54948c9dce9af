"""JobRecovery: finds JobStates that no worker will ever finish, and ends them."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from agent_async.state import JobStatus

if TYPE_CHECKING:
    from agent_async.agent import Agent

__all__ = ["JobRecovery", "dropped_outcome"]

logger = logging.getLogger(__name__)

# Jobs are looked at in pipelined batches of this size.
_BATCH = 500
# A state must have been still for this long before it is judged: covers the few milliseconds
# between arq claiming a job and on_job_start recording it.
_IDLE_GRACE_MS = 1000


def dropped_outcome(reason: str | None) -> tuple[JobStatus, str]:
    """The final status and error of a job the engine dropped, from the engine's stated reason."""
    reason = reason or "its queued job disappeared (expired or deleted)"
    status = JobStatus.CANCELED if reason.startswith("CancelledError") else JobStatus.FAILURE
    return status, f"dropped by the queue engine: {reason}"


class JobRecovery:
    """Reconciles JobState with what arq actually holds.

    arq drops some jobs without calling any hook (job key expired, payload that does not
    deserialize, function unknown to the worker, max tries exceeded). Their state would stay
    PENDING/STARTED/RETRY forever; here they end FAILURE with arq's reason, and their slot is freed.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def reconcile_dropped(self, *, idle_for_ms: int = _IDLE_GRACE_MS) -> int:
        """End every non-terminal state whose arq job no longer exists. Returns how many were ended."""
        persistency = self.agent.persistency
        job_ids = await persistency.active_job_ids(idle_for_ms=idle_for_ms)
        ended = 0
        for start in range(0, len(job_ids), _BATCH):
            batch = job_ids[start:start + _BATCH]
            await persistency.forget_inactive(batch)
            views = await self.agent.engine_views(batch)
            for job_id, view in views.items():
                if view.queued or view.in_progress:
                    continue
                status, error = dropped_outcome(view.dropped_reason)
                if await persistency.transition(job_id, status, error=error):
                    logger.warning("job %s ended %s: %s", job_id, status, error)
                    ended += 1
        return ended

    async def run_forever(self, interval_s: float) -> None:
        """The worker's background sweep; a failed pass is logged and retried next interval."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.reconcile_dropped()
            except Exception:
                logger.exception("reconcile pass failed; retrying in %.1fs", interval_s)
