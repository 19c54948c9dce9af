"""The store's values: what its callers hand it and what it answers (engine references, gate
claims, transitions to write, the cancel script's reply)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from agent_async.lifecycle import JobStatus

__all__ = ["CancelReply", "EngineJob", "EngineQueue", "EngineRef", "EngineRun", "GateClaim", "Transition"]


class CancelReply(Enum):
    """What the cancel script did."""

    UNKNOWN = "unknown"  # no such job
    REQUESTED = "requested"  # running: flagged, its worker stops it
    SETTLED = "settled"  # now (or already) terminal


@dataclass(frozen=True, slots=True)
class GateClaim:
    """A concurrency slot to take atomically with the enqueue."""

    key: str
    limit: int
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class EngineRef:
    """Where the queue engine keeps one job: opaque to the store, named by the engine.

    The store's scripts hand these keys to the engine's Lua functions (engine_queue, engine_drop,
    engine_requeue), which alone know what they hold.
    """

    queue_key: str
    job_key: str
    claim_key: str
    engine_job_id: str


@dataclass(frozen=True, slots=True)
class EngineQueue:
    """Where the queue engine queues this namespace's new jobs: its queue and the prefix of its job
    ids (engine job id = prefix + job id). The engine's Lua derives each job's keys and record from
    these (queue.lua's engine_job_key, engine_job_record)."""

    queue_key: str
    id_prefix: str


@dataclass(frozen=True, slots=True)
class EngineRun:
    """When the engine is to run a new job (its queue score, ms) and how long it keeps the job."""

    score_ms: int
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class EngineJob:
    """An engine job to queue (new, or again after its worker was lost): its bytes and run time."""

    ref: EngineRef
    job_bytes: bytes
    score_ms: int
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class Transition:
    """A state's move to a new status, decided now and written later: alone (`JobStore.call_for`)
    or among the finishes the fast worker sends together (engine/lua/finish_batch.lua)."""

    job_id: str
    status: JobStatus
    result: str = ""  # the result as JSON, '' for none
    error: str = ""
    # The start never ran (marked STARTED by a pickup, then dropped by the engine): undo its count.
    undo_start: bool = False
    # The attempt whose run this ends (0: any): a move to a status that is not an end happens only
    # while that attempt runs, so that one sent again after its reply was lost is a no-op.
    attempt: int = 0

    def texts(self) -> list[str | int]:
        """What a script that makes many transitions reads for this one (after the job's own fields)."""
        return [self.job_id, self.status.value, self.result, self.error, "1" if self.undo_start else "", self.attempt]
