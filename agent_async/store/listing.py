"""JobListing: the operator's reads across every job (filtered pages, counts), served from the store's
indexes (all jobs, per user, per job type, per terminal status, active) and never from a keyspace scan."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agent_async.lifecycle import ACTIVE, JobStatus, now_ms
from agent_async.state import JobState
from agent_async.store.jobs import JobStore, _reachable
from agent_async.store.scripts import LuaScript, lua_source, run_script

__all__ = ["JobListing", "JobOrder", "JobPage", "OverviewCounts"]

# A filtered listing reads its index this many entries at a time (one ZREVRANGE + one HMGET pipeline).
_PAGE_CHUNK = 200
_HOUR_MS = 3_600_000


class JobOrder(StrEnum):
    """The order a listing reads its index in: by score, highest first (newest) or lowest first (oldest)."""

    NEWEST = "newest"
    OLDEST = "oldest"


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a filtered listing, in the order asked for.

    `next_cursor` is the position (rank, in that order, counted from the creation window's first entry)
    in the index the page was read from where the next page starts
    (None: the index is exhausted); `truncated` means the scan budget ran out before the page filled
    (the filters matched too few of the entries looked at), so `next_cursor` continues the search.
    """

    states: list[JobState]
    next_cursor: int | None
    scanned: int
    truncated: bool


@dataclass(frozen=True, slots=True)
class OverviewCounts:
    ended: dict[tuple[str, JobStatus], int]
    active: dict[tuple[str, JobStatus], int]
    active_read: int  # active jobs looked at (capped): below the active index's size, counts are partial


def _pairs(flat: list[bytes | int]) -> dict[tuple[str, JobStatus], int]:
    counts: dict[tuple[str, JobStatus], int] = {}
    for field_name, value in zip(flat[::2], flat[1::2], strict=True):
        text = field_name.decode() if isinstance(field_name, bytes) else str(field_name)
        name, _, status = text.rpartition("|")
        counts[name, JobStatus(status)] = int(value)
    return counts


_OVERVIEW = LuaScript(lua_source("agent_async.store", "overview_counts.lua"))


class JobListing:
    """Reads only; the indexes are written by the store's scripts (enqueue.lua, lib.lua's end_job)."""

    def __init__(self, jobs: JobStore) -> None:
        self._jobs = jobs

    async def list_page(
        self,
        *,
        status: JobStatus | None = None,
        name: str | None = None,
        user_uid: str | None = None,
        order: JobOrder = JobOrder.NEWEST,
        created_since_ms: int | None = None,
        created_until_ms: int | None = None,
        cursor: int = 0,
        limit: int = 50,
        scan_limit: int = 5000,
    ) -> JobPage:
        """Jobs of every user, filtered, read from the smallest index that covers one filter.

        Never a scan of the keyspace: the candidate indexes (user, job type, terminal status or the
        active index, else all jobs) are sized with one ZCOUNT pipeline; the others filters are checked
        with one HMGET pipeline per chunk of that index, looking at `scan_limit` entries at most.
        The active index is ordered by last transition, the others by creation (a status index: by end).

        A creation window (`created_since_ms` <= created < `created_until_ms`) is a score range of an
        index scored by creation (user, job type, all jobs): with one, the status is checked like the
        other filters, since the status and active indexes are scored by other times.
        """
        k = self._jobs.keys
        windowed = created_since_ms is not None or created_until_ms is not None
        low = "-inf" if created_since_ms is None else str(created_since_ms)
        # Exclusive: an `until` from a minute-precision form field means "before that minute".
        high = "+inf" if created_until_ms is None else f"({created_until_ms}"
        candidates: list[tuple[str, dict[str, str | None]]] = []
        if user_uid is not None:
            candidates.append((k.user_index(user_uid), {"name": name, "status": status}))
        if name is not None:
            candidates.append((k.name_index(name), {"user": user_uid, "status": status}))
        if status is not None and not windowed:
            index = k.active_index if status in ACTIVE else k.status_index(status.value)
            candidates.append((index, {"user": user_uid, "name": name, "status": status if status in ACTIVE else None}))
        if not candidates:
            candidates.append((k.all_index, {"status": status}))
        with _reachable("list jobs"):
            async with self._jobs.redis.pipeline(transaction=False) as pipe:
                for index, _ in candidates:
                    pipe.zcount(index, low, high)
                sizes = await pipe.execute()
            (size, index, residual) = min((int(n), i, r) for n, (i, r) in zip(sizes, candidates, strict=True))
            # The window's first rank in the chosen order. The cursor counts from there, so jobs created
            # after the window (or pruned before it) do not move the next page.
            if order is JobOrder.NEWEST:
                before = 0 if created_until_ms is None else int(
                    await self._jobs.redis.zcount(index, str(created_until_ms), "+inf")
                )
            else:
                before = 0 if created_since_ms is None else int(
                    await self._jobs.redis.zcount(index, "-inf", f"({created_since_ms}")
                )
            end = before + size
            wanted = {f: str(v) for f, v in residual.items() if v is not None}
            matched, position, scanned = await self._scan_index(
                index, order, wanted, before + cursor, end, limit, scan_limit
            )
        states = [s for s in await self._jobs.get_many(matched) if s is not None]
        exhausted = position >= end
        return JobPage(
            states=states, next_cursor=None if exhausted else position - before, scanned=scanned,
            truncated=not exhausted and len(matched) < limit,
        )

    async def _scan_index(
        self, index: str, order: JobOrder, wanted: dict[str, str], start: int, end: int, limit: int,
        scan_limit: int,
    ) -> tuple[list[str], int, int]:
        """Ranks [start, end) of `index` in `order`, filtered by `wanted`: (matched ids, next rank, looked at)."""
        matched: list[str] = []
        position, scanned = start, 0
        fields = sorted(wanted)
        read = self._jobs.redis.zrevrange if order is JobOrder.NEWEST else self._jobs.redis.zrange
        while len(matched) < limit and scanned < scan_limit and position < end:
            step = limit - len(matched) if not wanted else min(_PAGE_CHUNK, scan_limit - scanned)
            last = min(position + step, end) - 1
            ids = [i.decode() for i in await read(index, position, last)]
            if not ids:
                break
            if wanted:
                async with self._jobs.redis.pipeline(transaction=False) as pipe:
                    for job_id in ids:
                        pipe.hmget(self._jobs.keys.state(job_id), fields)
                    rows = await pipe.execute()
            else:
                rows = [[] for _ in ids]
            for job_id, row in zip(ids, rows, strict=True):
                position += 1
                scanned += 1
                values = dict(zip(fields, (v.decode() if v is not None else None for v in row), strict=True))
                if all(values.get(f) == v for f, v in wanted.items()):
                    matched.append(job_id)
                    if len(matched) >= limit:
                        break
        return matched, position, scanned

    async def overview_counts(self, *, since_ms: int, active_limit: int = 10_000) -> OverviewCounts:
        """Jobs per (job name, status): the ended ones from the hourly counters end_job keeps, from the
        hour of `since_ms` on (an hour is counted whole), and the non-terminal ones read from the active
        index (its oldest `active_limit` at most). One script call."""
        keys = self._jobs.keys
        last = now_ms() // _HOUR_MS
        # No counter outlives the retention (plus its hour): older hours need not be looked at.
        first = max(since_ms // _HOUR_MS, last - self._jobs.retention_s // 3600 - 1)
        call = _OVERVIEW([keys.active_index], [keys.state(""), keys.ended_counts(""), first, last, active_limit])
        with _reachable("count jobs"):
            ended, active, read = await run_script(self._jobs.redis, call)
        return OverviewCounts(ended=_pairs(ended), active=_pairs(active), active_read=int(read))

    async def ended_since(self, status: JobStatus, since_ms: int) -> int:
        """How many jobs ended with this terminal status since `since_ms` (its status index)."""
        with _reachable("count jobs"):
            return int(await self._jobs.redis.zcount(self._jobs.keys.status_index(status.value), since_ms, "+inf"))

    async def group_id_of(self, job_id: str) -> str | None:
        """The fan-out group a job is a child of (None: it is none's)."""
        keys = self._jobs.keys
        with _reachable("read a job"):
            raw = await self._jobs.redis.hget(keys.state(job_id), "group")  # type: ignore[misc]
        if raw is None:
            return None
        return str(raw.decode()).removeprefix(keys.group(""))
