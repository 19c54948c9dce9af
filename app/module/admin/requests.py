"""Job requests of the admin module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agent_async import JobRequest, StorageUnavailableError

__all__ = ["JobRequestCleanupLargeStore"]


@dataclass
class JobRequestCleanupLargeStore(JobRequest):
    """Daily: purge agent-owned blobs older than AGENT_LARGE_STORE_MAX_AGE_SECONDS."""

    name: ClassVar[str] = "admin.cleanup.large_store"
    cron: ClassVar[str | None] = "30 3 * * *"
    soft_timeout_seconds: ClassVar[float] = 600
    max_try: ClassVar[int] = 3
    # A purge is idempotent: re-running it after a crash deletes nothing twice.
    resume: ClassVar[bool] = True
    max_concurrent: ClassVar[int] = 1
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (StorageUnavailableError,)
