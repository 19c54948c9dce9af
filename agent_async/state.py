"""JobState: what is known of one job (its Redis form is defined in agent_async.store.schema)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent_async.lifecycle import TERMINAL, JobStatus, now_ms

__all__ = ["JobState", "keyed_job_id", "new_job_id"]


def new_job_id() -> str:
    """A new job's id: 32 hex digits, 128 random bits (uuid4's hex form carries 122, and costs an
    enqueue several times as much to make)."""
    return os.urandom(16).hex()


def keyed_job_id(name: str, user_uid: str | None, key: str) -> str:
    """The id of the job that `ClientAgent.enqueue_once` queues for this idempotency key: 32 hex
    digits like a drawn id, derived from the job's name, its user and the key (the same key of
    two users, or for two kinds of job, names two jobs)."""
    scoped = "\x00".join((name, user_uid or "", key)).encode()
    return hashlib.sha256(scoped).hexdigest()[:32]


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _from_iso(value: str | None) -> int | None:
    return None if value is None else int(datetime.fromisoformat(value).timestamp() * 1000)


@dataclass(slots=True)
class JobState:
    """What is known of one job. Times are epoch milliseconds (UTC); `to_dict` renders ISO 8601."""

    job_id: str
    name: str
    user_uid: str | None = None
    status: JobStatus = JobStatus.PENDING
    payload: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    error: str | None = None
    attempts: int = 0
    schedule_name: str | None = None
    created_ms: int = field(default_factory=now_ms)
    started_ms: int | None = None
    finished_ms: int | None = None
    # While it runs, what report_progress() said last: fraction, message, details, updated_ms.
    progress: dict[str, Any] | None = None
    # The job this one retries (ClientAgent.retry): same request, a new id.
    retry_of: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    def to_dict(self) -> dict[str, Any]:
        """Internal transport form (JSON-safe); the public API view is built by a serializer."""
        return {
            "job_id": self.job_id,
            "name": self.name,
            "user_uid": self.user_uid,
            "status": self.status.value,
            "payload": self.payload,
            "result": self.result,
            "error": self.error,
            "attempts": self.attempts,
            "schedule_name": self.schedule_name,
            "created_at": _iso(self.created_ms),
            "started_at": _iso(self.started_ms),
            "finished_at": _iso(self.finished_ms),
            "progress": self.progress,
            "retry_of": self.retry_of,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobState:
        return cls(
            job_id=data["job_id"],
            name=data["name"],
            user_uid=data.get("user_uid"),
            status=JobStatus(data.get("status", JobStatus.PENDING)),
            payload=dict(data.get("payload") or {}),
            result=data.get("result"),
            error=data.get("error"),
            attempts=int(data.get("attempts", 0)),
            schedule_name=data.get("schedule_name"),
            created_ms=_from_iso(data.get("created_at")) or now_ms(),
            started_ms=_from_iso(data.get("started_at")),
            finished_ms=_from_iso(data.get("finished_at")),
            progress=data.get("progress"),
            retry_of=data.get("retry_of"),
        )
