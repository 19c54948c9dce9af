"""JobCanceller: cancels a job whatever its state, and waits (bounded) for it to be CANCELED."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from agent_async.state import JobState

if TYPE_CHECKING:
    from agent_async.agent import Agent

__all__ = ["JobCanceller"]

# How often the canceller looks at a running job's state while it waits for it to stop.
_POLL_S = 0.05
# Beyond the cancel grace: the time phase 2 and the worker's write take.
_WAIT_MARGIN_S = 3.0


class JobCanceller:
    """Two-phase cancellation, idempotent.

    - Not started (PENDING, RETRY, deferred): CANCELED at once, taken out of arq's queue in the
      same script, slot released; it never runs.
    - Running: flagged and announced on the namespace's cancel channel. The worker running it
      cancels its task (phase 1: `process()` can clean up in `finally`); after the cancel grace,
      phase 2 kills its child processes and abandons the task; the state ends CANCELED. A job
      whose worker is dead is ended CANCELED by the next recovery pass.
    - Terminal: returned unchanged.
    No arq abort is used, so no stale abort entry can ever hit a later job.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def cancel(self, job_id: str, *, wait_s: float | None = None) -> JobState | None:
        """Cancel and return the state; for a running job, wait up to `wait_s` for it to stop.

        `wait_s` defaults to the cancel grace plus a margin; 0 returns at once (still STARTED).
        None for an unknown job id.
        """
        persistency = self.agent.persistency
        reply = await persistency.cancel(job_id, engine=self.agent.engine_drop(job_id))
        if not reply:
            return None
        if reply == "REQUESTED":
            if wait_s is None:
                wait_s = self.agent.settings.cancel_grace_s + _WAIT_MARGIN_S
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                state = await persistency.get(job_id)
                if state is None or state.is_terminal:
                    return state
                await asyncio.sleep(_POLL_S)
        return await persistency.get(job_id)
