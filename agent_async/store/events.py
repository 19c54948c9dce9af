"""EventLog: the namespace's stream of job events (transitions and progress), read in order.

The events are written by the store's scripts themselves (lib.lua's emit_known, progress.lua), in
the same script as the change they describe; this module reads them and records progress.

A stream entry holds one event, or several of one script call (a claim's, a batch of finishes, an
enqueue call: type 'batch', a JSON list). An event's id is its entry's stream id, `ms-seq`, and
`ms-seq.k` for the k-th (from 0) of an entry of several: ids order the events, and a reader resumes
after any of them, inside an entry too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agent_async.lifecycle import TERMINAL, JobStatus, now_ms
from agent_async.store import codec
from agent_async.store.jobs import JobStore, _reachable
from agent_async.store.scripts import run_script, store_script

__all__ = ["EVENT_ID_PATTERN", "FROM_START", "EventLog", "EventType", "JobEvent"]

# The stream id to read from to get every event still kept.
FROM_START = "0-0"
# An event id as a reader gives it back (SSE's Last-Event-ID): a stream id, ms-seq (19 digits each
# always fit the 64 bits Redis allows), with .k for the k-th event of an entry of several.
EVENT_ID_PATTERN = r"^[0-9]{1,19}-[0-9]{1,19}(\.[0-9]{1,4})?$"


class EventType(StrEnum):
    STATUS = "status"
    PROGRESS = "progress"


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One event; `event_id` is its stream id, with `.k` for the k-th event of an entry of several
    (a reader resumes after it: SSE's Last-Event-ID)."""

    event_id: str
    type: EventType
    job_id: str
    status: JobStatus
    name: str
    user_uid: str | None
    attempts: int
    at_ms: int
    error: str | None = None
    fraction: float | None = None
    message: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.type is EventType.STATUS and self.status in TERMINAL

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.event_id, "type": self.type.value, "job_id": self.job_id, "status": self.status.value,
            "name": self.name, "user_uid": self.user_uid, "attempts": self.attempts, "at_ms": self.at_ms,
            "error": self.error, "fraction": self.fraction, "message": self.message,
        }


# An entry of several events (lib.lua's send_events).
_BATCH = "batch"


def _events(entry_id: bytes, fields: dict[bytes, bytes]) -> list[JobEvent]:
    """The events of one stream entry, in order."""
    f = {k.decode(): v.decode() for k, v in fields.items()}
    base = entry_id.decode()
    if f.get("type") == _BATCH:
        return [
            JobEvent(
                event_id=f"{base}.{k}", type=EventType.STATUS, job_id=job, status=JobStatus(status), name=name,
                user_uid=user or None, attempts=int(attempts or 0), at_ms=int(ms or 0), error=error or None,
            )
            for k, (job, status, name, user, attempts, error, ms) in enumerate(json.loads(f["events"]))
        ]
    kind = EventType(f.get("type", "status"))
    return [JobEvent(
        event_id=base, type=kind, job_id=f["job"], status=JobStatus(f["status"]), name=f.get("name", ""),
        user_uid=f.get("user") or None, attempts=int(f.get("attempts") or 0), at_ms=int(f.get("ms") or 0),
        error=f.get("error") or None,
        fraction=float(f["fraction"]) if kind is EventType.PROGRESS else None,
        message=(f.get("message") or None) if kind is EventType.PROGRESS else None,
    )]


class EventLog:
    def __init__(self, jobs: JobStore, *, engine_lua: str) -> None:
        self._jobs = jobs
        self._progress = store_script("progress.lua", engine_lua, events_key=jobs.events_key)

    async def read(self, after: str = FROM_START, *, count: int = 100, block_ms: int | None = None) -> list[JobEvent]:
        """Events after the event id `after` (oldest first; those of up to `count` entries), waiting up
        to `block_ms` for one."""
        key = self._jobs.keys.events
        entry, _, index = after.partition(".")
        events: list[JobEvent] = []
        with _reachable("read events"):
            if index:
                # The reader stopped inside an entry of several events: the rest of that entry first
                # (nothing if it was trimmed meanwhile).
                for entry_id, fields in await self._jobs.redis.xrange(key, min=entry, max=entry, count=1):
                    events = _events(entry_id, fields)[int(index) + 1:]
            reply = await self._jobs.redis.xread({key: entry}, count=count, block=None if events else block_ms)
        events.extend(e for _, entries in reply for entry_id, fields in entries for e in _events(entry_id, fields))
        return events

    async def latest(self, count: int, *, job_id: str | None = None, scan: int = 5000) -> list[JobEvent]:
        """The newest events (of one job, if given, among the last `scan` entries), oldest first."""
        with _reachable("read events"):
            entries = await self._jobs.redis.xrevrange(self._jobs.keys.events, count=count if job_id is None else scan)
        events = [e for entry_id, fields in reversed(entries) for e in _events(entry_id, fields)]
        if job_id is not None:
            events = [e for e in events if e.job_id == job_id]
        return events[-count:] if count > 0 else []

    async def last_id(self) -> str:
        """The id of the newest entry kept ("0-0" if none): read after it for new events only."""
        with _reachable("read events"):
            entries: Sequence[Any] = await self._jobs.redis.xrevrange(self._jobs.keys.events, count=1)
        return entries[0][0].decode() if entries else FROM_START

    async def record_progress(self, job_id: str, fraction: float, message: str | None, details: dict[str, Any]) -> bool:
        """Store a running job's progress and append its event; False if it is not running."""
        details_json = codec.dumps(details) if details else ""
        args: list[str | int] = [job_id, repr(fraction), message or "", details_json, now_ms()]
        return bool(await run_script(self._jobs.redis, self._progress([self._jobs.keys.state(job_id)], args)))
