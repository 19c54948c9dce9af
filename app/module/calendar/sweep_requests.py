"""Job requests of the periodic sync of external calendars: the sweep and its group's finalizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from agent_async import GroupFinalizer, JobRequest
from app.module.calendar.requests import _TRANSIENT

__all__ = ["SWEEP_MAX_CALENDARS", "SWEEP_RUN_KIND", "JobRequestSyncExternalAuto",
           "JobRequestSyncExternalDone"]

SWEEP_RUN_KIND = "calendar.sync.external"
# Per tick: the longest-waiting due calendars first; the rest are due at the next tick.
SWEEP_MAX_CALENDARS = 1000


@dataclass
class JobRequestSyncExternalAuto(JobRequest):
    """Every 5 minutes: one run record, the due external calendars fanned out as one group."""

    name: ClassVar[str] = "calendar.sync.external.auto"
    cron: ClassVar[str | None] = "*/5 * * * *"
    soft_timeout_seconds: ClassVar[float] = 120
    max_try: ClassVar[int] = 1
    max_concurrent: ClassVar[int] = 1

    # The admin who asked for a manual sweep (POST /admin/sync/external); empty on a scheduled tick.
    # Not the job's user: every sweep runs as the system so that they all share one gate.
    requested_by: str = ""


@dataclass
class JobRequestSyncExternalDone(GroupFinalizer):
    """Ends the sweep's run record once every sync of its group has ended."""

    name: ClassVar[str] = "calendar.sync.external.done"
    max_try: ClassVar[int] = 3
    resume: ClassVar[bool] = True
    retry_for: ClassVar[tuple[type[BaseException], ...]] = _TRANSIENT

    run_id: str = ""
    started_at: str = ""  # ISO time, whole seconds: a sync recorded at or after it belongs to this run
    calendar_keys: list[str] = field(default_factory=list)
