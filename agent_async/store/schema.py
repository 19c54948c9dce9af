"""The JobState hash: every field the store and its Lua scripts read or write, in one place.

Payload and result are stored as JSON strings, so a script never decodes or re-encodes them.

| field | written by | content |
|---|---|---|
| name, status, payload, attempts, created_ms | enqueue | the JobState (its id is the key's, not a field) |
| user, schedule, retry_of | enqueue | owner uid, schedule name, the job this one retries (absent for none) |
| result, error | transition, orphan | the outcome (result JSON; error text `<ErrorKind>: ...`) |
| started_ms, finished_ms, updated_ms | start, transition, end | epoch ms |
| resume, max_try | enqueue | '1'/'0' and an int: lets the scripts apply the resume rule alone |
| gate, gate_ttl_ms | enqueue | the concurrency slot's zset key and its safety TTL |
| cancel_requested_ms | cancel | set while a running job is asked to stop |
| progress_fraction, _message, _details, _ms | progress | the last report_progress() of a running job |
| owned_blobs | enqueue | JSON list of the large-store references the job owns (see JobRequest.owned_blobs) |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_async.lifecycle import JobStatus
from agent_async.state import JobState
from agent_async.store import codec

__all__ = ["CANCEL_REQUESTED_FIELD", "OWNED_BLOBS_FIELD", "new_state_extras", "state_from_hash", "state_to_hash"]

CANCEL_REQUESTED_FIELD = "cancel_requested_ms"
OWNED_BLOBS_FIELD = "owned_blobs"


def state_to_hash(
    state: JobState, *, resume: bool, max_try: int, owned_blobs: list[str] | None = None
) -> dict[str, str]:
    """The hash fields enqueue writes for a new state."""
    fields = {
        "name": state.name,
        "status": state.status.value,
        "payload": codec.dumps(state.payload),
        "attempts": str(state.attempts),
        "created_ms": str(state.created_ms),
        "resume": "1" if resume else "0",
        "max_try": str(max_try),
    }
    optional = {
        "user": state.user_uid,
        "schedule": state.schedule_name,
        OWNED_BLOBS_FIELD: codec.dumps(owned_blobs) if owned_blobs else None,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    fields.update(_outcome_fields(state))
    return fields


def new_state_extras(state: JobState) -> list[str]:
    """The fields of a new state beyond those enqueue_job.lua writes itself (status PENDING,
    attempts 0 and the fields it takes as arguments), as field/value pairs: often none."""
    extras = _outcome_fields(state)
    if state.status is not JobStatus.PENDING:
        extras["status"] = state.status.value
    if state.attempts:
        extras["attempts"] = str(state.attempts)
    return [text for pair in extras.items() for text in pair]


def _outcome_fields(state: JobState) -> dict[str, str]:
    """The fields a state has once it ran (and a retry's origin): absent from most new states."""
    fields = {
        "error": state.error,
        "result": None if state.result is None else codec.dumps(state.result),
        "started_ms": None if state.started_ms is None else str(state.started_ms),
        "finished_ms": None if state.finished_ms is None else str(state.finished_ms),
        "retry_of": state.retry_of,
    }
    return {k: v for k, v in fields.items() if v is not None}


def state_from_hash(raw: Mapping[bytes, bytes], job_id: str) -> JobState:
    """The state of job `job_id` (its key's) from its hash. States written by earlier versions hold an
    `id` field: it is ignored (it always equalled the key's id; dropping it saved each state 40 bytes)."""
    h = {k.decode(): v.decode() for k, v in raw.items()}

    def opt_int(key: str) -> int | None:
        return int(h[key]) if h.get(key) else None

    return JobState(
        job_id=job_id,
        name=h["name"],
        user_uid=h.get("user") or None,
        status=JobStatus(h["status"]),
        payload=codec.loads(h["payload"]),
        result=codec.loads(h["result"]) if h.get("result") else None,
        error=h.get("error") or None,
        attempts=int(h.get("attempts", "0")),
        schedule_name=h.get("schedule") or None,
        created_ms=int(h["created_ms"]),
        started_ms=opt_int("started_ms"),
        finished_ms=opt_int("finished_ms"),
        progress=_progress(h),
        retry_of=h.get("retry_of") or None,
    )


def _progress(h: dict[str, str]) -> dict[str, Any] | None:
    if not h.get("progress_ms"):
        return None
    return {
        "fraction": float(h["progress_fraction"]),
        "message": h.get("progress_message") or None,
        "details": codec.loads(h["progress_details"]) if h.get("progress_details") else {},
        "updated_ms": int(h["progress_ms"]),
    }
