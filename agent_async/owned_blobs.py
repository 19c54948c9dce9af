"""OwnedBlobs: deletes the large-store blobs a job owns once the job has ended, however it ended.

Every way a job can end (its worker, a cancel before it starts, retries exhausted, recovery of a
lost worker, the engine dropping it) is a terminal state in Redis; rather than hooking each of
them, the store keeps an index of the jobs that own blobs, and a sweep (after every third
recovery pass a worker makes, and at once after a cancel) deletes the blobs of those whose state
is terminal or gone. Deleting twice is harmless; a blob store that is down is retried at the next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent_async.errors import StorageError
from agent_async.store import JobStore, codec

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
        # The index (store/keys.py owned_blobs) is written by the enqueue script; HSCAN pages it.
        cursor, page = await self._store.redis.hscan(self._store.keys.owned_blobs, self._cursor, count=self._page_size)
        self._cursor = int(cursor)
        return await self._release({k.decode(): codec.loads(v) for k, v in page.items()})

    async def release(self, job_id: str) -> int:
        """The same for one job (after a cancel): 1 if its blobs were deleted."""
        raw = await self._store.redis.hget(self._store.keys.owned_blobs, job_id)  # type: ignore[misc]
        return await self._release({job_id: list(codec.loads(raw))}) if raw else 0

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
        if done:
            await self._store.redis.hdel(self._store.keys.owned_blobs, *done)  # type: ignore[misc]
        return len(done)
