"""JobRecovery: settles JobStates that no worker will finish: dropped by arq, or lost with a worker."""

from __future__ import annotations

import logging

from agent_async.engine import Engine, EngineView
from agent_async.lifecycle import JobStatus, dropped_outcome, now_ms
from agent_async.state import JobState
from agent_async.store import JobStore

__all__ = ["JobRecovery"]

logger = logging.getLogger(__name__)

# Jobs are looked at in pipelined batches of this size.
_BATCH = 500
# A state must have been still for this long before it is judged: covers the few milliseconds
# between the engine claiming a job and its start being recorded.
_IDLE_GRACE_MS = 1000


class JobRecovery:
    """Reconciles JobState with what the engine and the workers actually hold.

    - The engine drops some jobs without calling any hook (with arq, a job key expired, payload
      that does not deserialize, function unknown to the worker, its own try limit): they end
      FAILURE with the engine's reason and their slot is freed.
    - A STARTED job whose worker stopped renewing its lease, or a PENDING/RETRY job missing from
      the engine's queue, is an orphan: re-queued under the same id when its request says `resume` and
      it has attempts left, otherwise FAILURE (worker lost), or CANCELED if a cancel was pending.
    Every change is one atomic script that re-checks the job first, so concurrent passes by
    several workers are safe; the lock only avoids duplicated work.
    """

    def __init__(self, store: JobStore, *, engine: Engine, page_size: int | None = None) -> None:
        self._store = store
        self._engine = engine
        # With a page size, each pass looks at the runs whose lease ran out plus one page of the
        # active index, resuming where the last pass stopped: a pass costs the same with a
        # backlog of a hundred jobs or of a million.
        self.page_size = page_size
        self._offset = 0

    async def reconcile_orphans(self, *, lock_ttl_s: float = 60.0, hold: bool = False) -> int | None:
        """One pass under the namespace's recovery lock (so one worker sweeps); None if held.

        `hold`: keep the lock until its TTL runs out instead of releasing it after the pass. The
        periodic passes hold it for about their interval: the namespace then makes one pass per
        interval, not one per worker, and an idle worker spends three Redis commands less on each.
        """
        lock = self._store.keys.recovery_lock
        token = await self._store.acquire_lock(lock, ttl_s=lock_ttl_s)
        if token is None:
            return None
        try:
            return await self.reconcile()
        finally:
            if not hold:
                # Released only by its owner: a pass that outlived the TTL must not free another's lock.
                await self._store.release_lock(lock, token)

    async def reconcile(self, *, idle_for_ms: int = _IDLE_GRACE_MS) -> int:
        """Settle the active jobs that no worker or queue holds. Returns how many were settled."""
        if self.page_size is None:
            job_ids = await self._store.active_job_ids(idle_for_ms=idle_for_ms)
        else:
            page = await self._store.active_job_ids(idle_for_ms=idle_for_ms, offset=self._offset, limit=self.page_size)
            self._offset = 0 if len(page) < self.page_size else self._offset + len(page)
            job_ids = list(dict.fromkeys([*await self._store.expired_leases(), *page]))
        settled = 0
        for start in range(0, len(job_ids), _BATCH):
            batch = job_ids[start:start + _BATCH]
            states = await self._store.get_many(batch)
            await self._store.forget_inactive(batch)
            live = [s for s in states if s is not None and not s.is_terminal]
            if live:
                settled += await self._settle(live)
        return settled

    async def _settle(self, states: list[JobState]) -> int:
        ids = [s.job_id for s in states]
        views = await self._engine.views(ids)
        leases = await self._store.lease_expiries(ids)
        now = now_ms()
        settled = 0
        for state, lease in zip(states, leases, strict=True):
            view = views[state.job_id]
            engine_gone = not view.queued and not view.in_progress
            if engine_gone and (view.dropped is not None or state.status is JobStatus.STARTED):
                # The engine finished with it without our outcome being recorded.
                settled += await self._end_dropped(state, view)
            elif state.status is JobStatus.STARTED and lease is not None and lease > now:
                continue  # its worker is alive and renewing the lease
            elif state.status is not JobStatus.STARTED and view.queued:
                settled += await self._release_stale_claim(state, view)
            else:
                settled += await self._settle_orphan(state)
        return settled

    async def _release_stale_claim(self, state: JobState, view: EngineView) -> int:
        """A queued job is waiting, unless a worker claimed it and was lost before starting it:
        the engine would then leave it alone until the claim expires (with arq, up to its longest
        function timeout + 10 s). A claim older than a lease without a start is released."""
        if view.claimed_ms_ago is None or view.claimed_ms_ago <= self._store.lease_ms:
            return 0
        if not await self._engine.release_stale_claim(state.job_id):
            return 0
        logger.warning("job %s: claimed %d ms ago but never started; released", state.job_id, view.claimed_ms_ago)
        return 1

    async def _end_dropped(self, state: JobState, view: EngineView) -> int:
        dropped = view.dropped
        outcome = dropped_outcome(dropped.reason if dropped else None, canceled=bool(dropped and dropped.canceled))
        if await self._store.transition(state.job_id, outcome.status, error=outcome.error):
            logger.warning("job %s ended %s: %s", state.job_id, outcome.status, outcome.error)
            return 1
        return 0

    async def _settle_orphan(self, state: JobState) -> int:
        outcome = await self._store.settle_orphan(state.job_id, engine=self._engine.job(state))
        if outcome is not None:
            logger.warning("job %s was orphaned (%s, attempt %d): now %s",
                           state.job_id, state.status, state.attempts, outcome)
            return 1
        return 0
