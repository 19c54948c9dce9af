"""Run records: a SQL row per run of a job kind, with its trigger, progress, outcome and stale cleanup."""

from __future__ import annotations

from agent_async.runs.records import (
    DEFAULT_STALE_AFTER_S,
    MAX_COUNTERS_CHARS,
    MAX_ERROR_CHARS,
    MAX_FAILED_ID_CHARS,
    MAX_FAILED_IDS,
    MAX_LIST_LIMIT,
    STALE_ERROR,
    TERMINAL_RUN_STATUSES,
    RunNotFoundError,
    RunRecord,
    RunRecords,
    RunStatus,
    RunTrigger,
)

__all__ = [
    "DEFAULT_STALE_AFTER_S",
    "MAX_COUNTERS_CHARS",
    "MAX_ERROR_CHARS",
    "MAX_FAILED_IDS",
    "MAX_FAILED_ID_CHARS",
    "MAX_LIST_LIMIT",
    "STALE_ERROR",
    "TERMINAL_RUN_STATUSES",
    "RunNotFoundError",
    "RunRecord",
    "RunRecords",
    "RunStatus",
    "RunTrigger",
]
