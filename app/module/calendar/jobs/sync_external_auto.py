"""Workers of the periodic sync: calendar.sync.external.auto (the sweep) and its finalizer."""

from __future__ import annotations

import itertools
import logging
from datetime import UTC, datetime
from typing import Any

from agent_async import Job, RunStatus, RunTrigger, agent_job
from app.module.calendar.jobs.sync_external import guard_name
from app.module.calendar.repository import CalendarRepository, DueCalendar
from app.module.calendar.requests import JobRequestSyncExternal
from app.module.calendar.sweep_requests import (
    SWEEP_MAX_CALENDARS,
    SWEEP_RUN_KIND,
    JobRequestSyncExternalAuto,
    JobRequestSyncExternalDone,
)
from app.runtime import current_runtime

__all__ = ["JobSyncExternalAuto", "JobSyncExternalDone", "interleave_hosts"]

logger = logging.getLogger(__name__)


@agent_job
class JobSyncExternalAuto(Job[JobRequestSyncExternalAuto]):
    request_class = JobRequestSyncExternalAuto

    async def process(
        self, request: JobRequestSyncExternalAuto, *, user_uid: str | None, job_id: str
    ) -> dict[str, Any]:
        runtime = current_runtime()
        runs = runtime.agent.runs
        started = datetime.now(UTC).replace(microsecond=0)
        trigger = RunTrigger.MANUAL if request.requested_by else RunTrigger.SCHEDULED
        user_uid = request.requested_by or user_uid
        # A sweep's group outlives its job: the previous sweep is still going while its run is
        # running (a run whose worker died is marked stale first, so it cannot block every sweep).
        await runs.mark_stale(SWEEP_RUN_KIND)
        going = await runs.list(kind=SWEEP_RUN_KIND, status=RunStatus.RUNNING, limit=1)
        record = await runs.start(SWEEP_RUN_KIND, triggered_by=trigger, user_uid=user_uid, job_id=job_id)
        if going:
            why = f"skipped: the previous sweep (run {going[0].run_id}) is still running"
            await runs.finish(record.run_id, RunStatus.SKIPPED, counters=_counters(0, 0, 0, 0), error=why)
            logger.info("job %s: %s", job_id, why)
            return {"run_id": record.run_id, "skipped_for": going[0].run_id, "due": 0, "group_id": None}
        try:
            due = await CalendarRepository(runtime.engine).due_external(started, limit=SWEEP_MAX_CALENDARS)
            if not due:
                await runs.finish(record.run_id, RunStatus.SUCCESS, counters=_counters(0, 0, 0, 0))
                return {"run_id": record.run_id, "due": 0, "group_id": None}
            # The children run without a user (this is a system job): each carries the owner its
            # calendar must still have, checked before anything is fetched.
            due = interleave_hosts(due)
            children = [JobRequestSyncExternal(calendar_key=c.key, owner_uid=c.owner_uid) for c in due]
            finalizer = JobRequestSyncExternalDone(
                run_id=record.run_id, started_at=started.isoformat(), calendar_keys=[c.key for c in due]
            )
            group_id = await self.resources.groups.create(
                children, finalizer, max_in_flight=runtime.settings.ics_sweep_max_in_flight
            )
            await runs.heartbeat(record.run_id, counters=_counters(len(due), 0, 0, 0), group_id=group_id)
        except BaseException as exc:
            await runs.finish(record.run_id, RunStatus.ERROR, error=f"{type(exc).__name__}: {exc}"[:500])
            raise
        logger.info("job %s: %d external calendars due, group %s", job_id, len(due), group_id)
        return {"run_id": record.run_id, "due": len(due), "group_id": group_id}


def interleave_hosts(due: list[DueCalendar]) -> list[DueCalendar]:
    """Round-robin over hosts, each host's calendars in their order: the group's window releases
    children in this order, so a host with many calendars (paced by its guard) cannot fill the
    whole window while other hosts' syncs wait."""
    by_host: dict[str, list[DueCalendar]] = {}
    for calendar in due:
        by_host.setdefault(guard_name(calendar.url), []).append(calendar)
    rounds = itertools.zip_longest(*by_host.values())
    return [calendar for round_ in rounds for calendar in round_ if calendar is not None]


def _counters(due: int, synced: int, unchanged: int, failed: int) -> dict[str, int]:
    return {"due": due, "synced": synced, "unchanged": unchanged, "failed": failed}


@agent_job
class JobSyncExternalDone(Job[JobRequestSyncExternalDone]):
    request_class = JobRequestSyncExternalDone

    async def process(
        self, request: JobRequestSyncExternalDone, *, user_uid: str | None, job_id: str
    ) -> dict[str, Any]:
        runtime = current_runtime()
        since = datetime.fromisoformat(request.started_at)
        statuses = await CalendarRepository(runtime.engine).sync_statuses(request.calendar_keys)
        synced = unchanged = 0
        failed: list[str] = []
        for key in request.calendar_keys:
            status, at = statuses.get(key, (None, None))
            fresh = at is not None and at >= since
            if fresh and status == "synced":
                synced += 1
            elif fresh and status == "unchanged":
                unchanged += 1
            else:
                failed.append(key)  # an error, a calendar gone meanwhile, or a child that never ran
        total = len(request.calendar_keys)
        if not failed:
            final, error = RunStatus.SUCCESS, None
        elif len(failed) < total:
            final, error = RunStatus.PARTIAL, None
        else:
            final, error = RunStatus.ERROR, f"all {total} syncs failed"
        counters = _counters(total, synced, unchanged, len(failed))
        await runtime.agent.runs.finish(request.run_id, final, counters=counters, error=error, failed_ids=failed)
        view = await self.resources.groups.get(request.group_id)
        return {"run_id": request.run_id, "status": final.value, **counters,
                "group": None if view is None else {"succeeded": view.succeeded, "failed": view.failed,
                                                    "canceled": view.canceled}}
