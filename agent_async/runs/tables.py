"""Run records as stored: the SQL table (library migration 0003), its column values and RunRecord, one row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import BigInteger, Column, Index, RowMapping, String, Table, Text
from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeEngine

from agent_async.storage.schema import metadata

__all__ = ["RUN_TABLE", "TERMINAL_RUN_STATUSES", "RunRecord", "RunStatus", "RunTrigger", "run_table"]

RUN_TABLE = "agent_async_run"

RUN_ID_CHARS = 32
NAMESPACE_CHARS = 64
KIND_CHARS = 255
TRIGGER_CHARS = 16
USER_UID_CHARS = 255
STATUS_CHARS = 16
JOB_ID_CHARS = 255
GROUP_ID_CHARS = 255


class RunStatus(StrEnum):
    """Where a run is: RUNNING until it ends in one of the TERMINAL_RUN_STATUSES, once."""

    RUNNING = "running"
    SUCCESS = "success"
    # Done, but some items failed (see failed_ids and the counters).
    PARTIAL = "partial"
    ERROR = "error"
    CANCELLED = "cancelled"
    # Not run: another run of its kind was still going (the record says which, in `error`).
    SKIPPED = "skipped"


TERMINAL_RUN_STATUSES = frozenset(status for status in RunStatus if status is not RunStatus.RUNNING)


class RunTrigger(StrEnum):
    """What started a run; the user it runs for, if any, is `user_uid` (a manual run may have none: ops, CLI)."""

    SCHEDULED = "scheduled"
    MANUAL = "manual"


def identifier(chars: int) -> TypeEngine[str]:
    """A VARCHAR holding any Unicode text, compared byte for byte on every database.

    MariaDB's default collations ignore case (and trailing spaces): without this, the namespace
    `Prod` would read `prod`'s rows, and a list filtered on user `Alice` would show `alice`'s runs.
    PostgreSQL and SQLite already compare these exactly. Always utf8mb4, whatever the database's
    default charset (latin1 on some servers).
    """
    return String(chars).with_variant(
        mysql.VARCHAR(chars, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


# MySQL's TEXT stops at 64 KiB, less than the failed-id list may take (records.MAX_FAILED_IDS ids
# of up to 255 characters); MEDIUMTEXT holds 16 MiB. The JSON is ASCII, so characters = bytes.
JSON_TEXT = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
# Any Unicode text, whatever the database's default charset.
MESSAGE_TEXT = Text().with_variant(mysql.TEXT(charset="utf8mb4"), "mysql", "mariadb")

# One row per run of a job kind: who started it, how it is going, how it ended.
run_table = Table(
    RUN_TABLE,
    metadata,
    # uuid4 hex, made by RunRecords.start.
    Column("run_id", String(RUN_ID_CHARS), primary_key=True),
    # The deployment's AGENT_NAMESPACE: two deployments may share one database.
    Column("namespace", identifier(NAMESPACE_CHARS), nullable=False),
    Column("kind", identifier(KIND_CHARS), nullable=False),
    # RunTrigger: scheduled or manual; the user, if any, is user_uid.
    Column("triggered_by", String(TRIGGER_CHARS), nullable=False),
    Column("user_uid", identifier(USER_UID_CHARS), nullable=True),
    # RunStatus.
    Column("status", String(STATUS_CHARS), nullable=False),
    # A JSON object, e.g. {"synced": 3, "failed": 1}.
    Column("counters", JSON_TEXT, nullable=False),
    # Plain text, at most records.MAX_ERROR_CHARS characters: TEXT is enough everywhere.
    Column("error", MESSAGE_TEXT, nullable=True),
    # A JSON list of strings.
    Column("failed_ids", JSON_TEXT, nullable=False),
    Column("job_id", identifier(JOB_ID_CHARS), nullable=True),
    Column("group_id", identifier(GROUP_ID_CHARS), nullable=True),
    # Epoch milliseconds (UTC), written by the client, like every library table (see storage/schema.py).
    Column("started_ms", BigInteger, nullable=False),
    Column("finished_ms", BigInteger, nullable=True),
    Column("heartbeat_ms", BigInteger, nullable=False),
    # The list queries, newest first with run_id as the tie-break of the keyset paging: by kind,
    # unfiltered, by user, by status. The stale cleanup uses the status index too (running rows are few).
    Index("ix_agent_async_run_kind_started", "namespace", "kind", "started_ms", "run_id"),
    Index("ix_agent_async_run_started", "namespace", "started_ms", "run_id"),
    Index("ix_agent_async_run_user_started", "namespace", "user_uid", "started_ms", "run_id"),
    Index("ix_agent_async_run_status", "namespace", "status", "started_ms", "run_id"),
)


def _iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run, as stored. Times are epoch milliseconds (UTC); `to_dict` renders them in ISO 8601."""

    run_id: str
    namespace: str
    kind: str
    triggered_by: RunTrigger
    user_uid: str | None
    status: RunStatus
    counters: dict[str, Any]
    error: str | None
    failed_ids: tuple[str, ...]
    job_id: str | None
    group_id: str | None
    started_ms: int
    finished_ms: int | None
    heartbeat_ms: int

    @classmethod
    def from_row(cls, row: RowMapping) -> RunRecord:
        return cls(
            run_id=row["run_id"], namespace=row["namespace"], kind=row["kind"],
            triggered_by=RunTrigger(row["triggered_by"]), user_uid=row["user_uid"], status=RunStatus(row["status"]),
            counters=json.loads(row["counters"]), error=row["error"],
            failed_ids=tuple(json.loads(row["failed_ids"])), job_id=row["job_id"], group_id=row["group_id"],
            started_ms=int(row["started_ms"]),
            finished_ms=None if row["finished_ms"] is None else int(row["finished_ms"]),
            heartbeat_ms=int(row["heartbeat_ms"]),
        )

    @property
    def cursor(self) -> str:
        """Opaque position of this record in a list: pass it as `before=` to get the next (older) page."""
        return f"{self.started_ms}:{self.run_id}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view for an API (the namespace, a deployment detail, is left out)."""
        return {
            "run_id": self.run_id,
            "kind": self.kind,
            "triggered_by": self.triggered_by.value,
            "user_uid": self.user_uid,
            "status": self.status.value,
            "counters": dict(self.counters),
            "error": self.error,
            "failed_ids": list(self.failed_ids),
            "job_id": self.job_id,
            "group_id": self.group_id,
            "started_at": _iso(self.started_ms),
            "finished_at": None if self.finished_ms is None else _iso(self.finished_ms),
            "heartbeat_at": _iso(self.heartbeat_ms),
        }
