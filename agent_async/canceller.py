"""JobCanceller: cancels a job whatever its state, and waits (bounded) for it to be CANCELED."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from agent_async.state import JobState
from agent_async.store import CancelReply, EngineRef, JobStore

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

    def __init__(self, store: JobStore, *, engine_ref: Callable[[str], EngineRef], cancel_grace_s: float) -> None:
        self._store = store
        self._engine_ref = engine_ref
        self._cancel_grace_s = cancel_grace_s

    async def cancel(self, job_id: str, *, wait_s: float | None = None) -> JobState | None:
        """Cancel and return the state; for a running job, wait up to `wait_s` for it to stop.

        `wait_s` defaults to the cancel grace plus a margin; 0 returns at once (still STARTED).
        None for an unknown job id.
        """
        store = self._store
        reply = await store.cancel(job_id, engine=self._engine_ref(job_id))
        if reply is CancelReply.UNKNOWN:
            return None
        if reply is CancelReply.REQUESTED:
            if wait_s is None:
                wait_s = self._cancel_grace_s + _WAIT_MARGIN_S
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                state = await store.get(job_id)
                if state is None or state.is_terminal:
                    return state
                await asyncio.sleep(_POLL_S)
        return await store.get(job_id)
