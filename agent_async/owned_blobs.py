"""OwnedBlobs: deletes the large-store blobs a job owns once the job has ended, however it ended.

Every way a job can end (its worker, a cancel before it starts, retries exhausted, recovery of a
lost worker, the engine dropping it) is a terminal state in Redis; rather than hooking each of
them, the store keeps an index of the jobs that own blobs, and a sweep (every recovery pass of
every worker, and at once after a cancel) deletes the blobs of those whose state is terminal or
gone. Deleting twice is harmless; a blob store that is down is retried at the next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent_async.errors import StorageError
from agent_async.store import JobStore

if TYPE_CHECKING:
    from agent_async.storage import ClientStorage

__all__ = ["OwnedBlobs"]

logger = logging.getLogger(__name__)

# Jobs looked at per sweep (one HSCAN page; the next sweep goes on from there).
_PAGE = 500


class OwnedBlobs:
    def __init__(self, store: JobStore, *, large_store: Callable[[], ClientStorage], page_size: int = _PAGE) -> None:
        self._store = store
        self._large_store = large_store
        self._page_size = page_size
        self._cursor = 0

    async def sweep(self) -> int:
        """Delete the blobs of the ended jobs in one page of the index; returns how many jobs."""
        self._cursor, owned = await self._store.owned_blobs_page(self._cursor, count=self._page_size)
        return await self._release(owned)

    async def release(self, job_id: str) -> int:
        """The same for one job (after a cancel): 1 if its blobs were deleted."""
        refs = await self._store.owned_blobs_of(job_id)
        return await self._release({job_id: refs}) if refs else 0

    async def _release(self, owned: dict[str, list[str]]) -> int:
        if not owned:
            return 0
        ids = list(owned)
        states = await self._store.get_many(ids)
        ended = [job_id for job_id, state in zip(ids, states, strict=True) if state is None or state.is_terminal]
        done = []
        for job_id in ended:
            try:
                for ref in owned[job_id]:
                    await self._large_store().delete(ref)
            except StorageError as exc:
                logger.warning("job %s: its blobs could not be deleted yet (%s); the next sweep retries", job_id, exc)
                continue
            done.append(job_id)
        await self._store.forget_owned_blobs(done)
        return len(done)
