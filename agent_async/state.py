"""JobStatus and JobState: a job's lifecycle record, stored in Redis as a hash of JSON-safe fields."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from agent_async import codec

__all__ = ["ACTIVE", "TERMINAL", "JobState", "JobStatus", "now_ms"]


class JobStatus(StrEnum):
    PENDING = "PENDING"
    STARTED = "STARTED"
    RETRY = "RETRY"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    CANCELED = "CANCELED"


TERMINAL: frozenset[JobStatus] = frozenset({JobStatus.SUCCESS, JobStatus.FAILURE, JobStatus.CANCELED})
ACTIVE: frozenset[JobStatus] = frozenset(JobStatus) - TERMINAL


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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
        )

    def to_redis(self) -> dict[str, str]:
        """Hash fields; payload and result are JSON strings so Lua never re-encodes them."""
        fields = {
            "id": self.job_id,
            "name": self.name,
            "status": self.status.value,
            "payload": codec.dumps(self.payload),
            "attempts": str(self.attempts),
            "created_ms": str(self.created_ms),
        }
        optional = {
            "user": self.user_uid,
            "schedule": self.schedule_name,
            "error": self.error,
            "result": None if self.result is None else codec.dumps(self.result),
            "started_ms": None if self.started_ms is None else str(self.started_ms),
            "finished_ms": None if self.finished_ms is None else str(self.finished_ms),
        }
        fields.update({k: v for k, v in optional.items() if v is not None})
        return fields

    @classmethod
    def from_redis(cls, raw: Mapping[bytes, bytes]) -> JobState:
        h = {k.decode(): v.decode() for k, v in raw.items()}

        def opt_int(key: str) -> int | None:
            return int(h[key]) if h.get(key) else None

        return cls(
            job_id=h["id"],
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
        )
