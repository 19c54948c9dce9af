"""JobRecovery: settles JobStates that no worker will finish: dropped by arq, or lost with a worker."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from agent_async.state import JobState, JobStatus, now_ms

if TYPE_CHECKING:
    from agent_async.agent import Agent, EngineView

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
    """Reconciles JobState with what arq and the workers actually hold.

    - arq drops some jobs without calling any hook (job key expired, payload that does not
      deserialize, function unknown to the worker, its own try limit): they end FAILURE with
      arq's reason and their slot is freed.
    - A STARTED job whose worker stopped renewing its lease, or a PENDING/RETRY job missing from
      arq's queue, is an orphan: re-queued under the same id when its request says `resume` and
      it has attempts left, otherwise FAILURE (worker lost), or CANCELED if a cancel was pending.
    Every change is one atomic script that re-checks the job first, so concurrent passes by
    several workers are safe; the lock only avoids duplicated work.
    """

    def __init__(self, agent: Agent, *, page_size: int | None = None) -> None:
        self.agent = agent
        # With a page size, each pass looks at the runs whose lease ran out plus one page of the
        # active index, resuming where the last pass stopped: a pass costs the same with a
        # backlog of a hundred jobs or of a million.
        self.page_size = page_size
        self._offset = 0

    async def reconcile_orphans(self, *, lock_ttl_s: float = 60.0) -> int | None:
        """One pass under the namespace's recovery lock (so one worker sweeps); None if held."""
        token = uuid.uuid4().hex
        lock = self.agent.keys.recovery_lock
        redis = self.agent.redis
        if not await redis.set(lock, token, nx=True, px=int(lock_ttl_s * 1000)):
            return None
        try:
            return await self.reconcile()
        finally:
            # Released only by its owner: a pass that outlived the TTL must not free another's lock.
            if await redis.get(lock) == token.encode():
                await redis.delete(lock)

    async def reconcile(self, *, idle_for_ms: int = _IDLE_GRACE_MS) -> int:
        """Settle the active jobs that no worker or queue holds. Returns how many were settled."""
        persistency = self.agent.persistency
        if self.page_size is None:
            job_ids = await persistency.active_job_ids(idle_for_ms=idle_for_ms)
        else:
            page = await persistency.active_job_ids(idle_for_ms=idle_for_ms, offset=self._offset, limit=self.page_size)
            self._offset = 0 if len(page) < self.page_size else self._offset + len(page)
            job_ids = list(dict.fromkeys([*await persistency.expired_leases(), *page]))
        settled = 0
        for start in range(0, len(job_ids), _BATCH):
            batch = job_ids[start:start + _BATCH]
            states = await persistency.get_many(batch)
            await persistency.forget_inactive(batch)
            live = [s for s in states if s is not None and not s.is_terminal]
            if live:
                settled += await self._settle(live)
        return settled

    async def _settle(self, states: list[JobState]) -> int:
        ids = [s.job_id for s in states]
        views = await self.agent.engine_views(ids)
        leases = await self.agent.persistency.lease_expiries(ids)
        now = now_ms()
        settled = 0
        for state, lease in zip(states, leases, strict=True):
            view = views[state.job_id]
            engine_gone = not view.queued and not view.in_progress
            if engine_gone and (view.dropped_reason or state.status is JobStatus.STARTED):
                # arq finished with it without our outcome being recorded.
                settled += await self._end_dropped(state, view.dropped_reason)
            elif state.status is JobStatus.STARTED and lease is not None and lease > now:
                continue  # its worker is alive and renewing the lease
            elif state.status is not JobStatus.STARTED and view.queued:
                settled += await self._release_stale_claim(state, view)
            else:
                settled += await self._settle_orphan(state)
        return settled

    async def _release_stale_claim(self, state: JobState, view: EngineView) -> int:
        """A queued job is waiting, unless a worker claimed it and was lost before starting it:
        arq would then leave it alone until its in-progress key expires (up to its longest
        function timeout + 10 s). A claim older than a lease without a start is released."""
        if view.claimed_ms_ago is None or view.claimed_ms_ago <= self.agent.persistency.lease_ms:
            return 0
        if not await self.agent.release_stale_claim(state.job_id):
            return 0
        logger.warning("job %s: claimed %d ms ago but never started; released", state.job_id, view.claimed_ms_ago)
        return 1

    async def _end_dropped(self, state: JobState, reason: str | None) -> int:
        status, error = dropped_outcome(reason)
        if await self.agent.persistency.transition(state.job_id, status, error=error):
            logger.warning("job %s ended %s: %s", state.job_id, status, error)
            return 1
        return 0

    async def _settle_orphan(self, state: JobState) -> int:
        outcome = await self.agent.persistency.settle_orphan(
            state.job_id,
            engine=self.agent.engine_write(state),
            in_progress_key=self.agent.engine_in_progress_key(state.job_id),
        )
        if outcome:
            logger.warning("job %s was orphaned (%s, attempt %d): now %s",
                           state.job_id, state.status, state.attempts, outcome)
            return 1
        return 0
