"""Scheduler: turns a cron tick into one tracked run, honouring overrides, the allowlist and the gate."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from agent_async.errors import DuplicateJobError, RequestCode, RequestRefusedError, StorageError
from agent_async.registry import JobRegistry
from agent_async.request import JobRequest
from agent_async.schedules.cron import cron_problem, matches, next_fire
from agent_async.schedules.overrides import ScheduleOverride, ScheduleOverrides
from agent_async.settings import AgentSettings
from agent_async.state import JobState
from agent_async.store import JobStore

__all__ = ["FireResult", "ScheduleView", "Scheduler"]

logger = logging.getLogger(__name__)

# Recent skips remembered per schedule (newest first).
SKIPS_KEPT = 100


class FireResult(StrEnum):
    """What one tick of a schedule did."""

    ENQUEUED = "enqueued"
    DUPLICATE = "duplicate"  # another worker (or the other half of a day OR) got there first
    SKIPPED = "skipped"  # the previous run is still going (the gate is full)
    DISABLED = "disabled"
    INVALID = "invalid"  # the request cannot be built without arguments
    UNKNOWN = "unknown"  # no such schedule
    NOT_MINE = "not-mine"  # the tick is for the declared cron, or for the override ticker
    NOT_DUE = "not-due"  # the override ticker's minute does not match the replaced cron


class CreateJob(Protocol):
    """The enqueue path (Agent.create_job)."""

    def __call__(self, request: JobRequest, *, job_id: str, schedule_name: str) -> Awaitable[JobState]: ...


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """What an operator needs to know about one schedule."""

    name: str
    default_cron: str
    override: ScheduleOverride | None
    effective_cron: str | None
    enabled: bool
    disabled_reason: str | None
    last_run: JobState | None
    next_run: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "default_cron": self.default_cron,
            "override": None if self.override is None else {
                "enabled": self.override.enabled, "cron": self.override.cron,
                "updated_by": self.override.updated_by,
                "updated_at": datetime.fromtimestamp(self.override.updated_at_ms / 1000, UTC).isoformat(),
            },
            "effective_cron": self.effective_cron,
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "last_run": None if self.last_run is None else {
                "job_id": self.last_run.job_id, "status": self.last_run.status.value,
                "created_at": self.last_run.to_dict()["created_at"],
            },
            "next_run": None if self.next_run is None else self.next_run.isoformat(),
        }


class Scheduler:
    """The schedules are the registered requests that declare a `cron`; an operator may disable one
    or replace its cron at runtime (ScheduleOverrides), and AGENT_SCHEDULE_ALLOWLIST may restrict
    which run. A run's job id is `<schedule>@<fire time ms>`, so however many workers or arq crons
    see the same tick, one run is created."""

    def __init__(
        self,
        *,
        registry: JobRegistry,
        store: JobStore,
        create_job: CreateJob,
        overrides: ScheduleOverrides,
        settings: AgentSettings,
    ) -> None:
        self._registry = registry
        self._store = store
        self._create_job = create_job
        self.overrides = overrides
        self._allowlist = settings.schedule_allowlist
        self.timezone = ZoneInfo(settings.schedule_timezone)

    def schedules(self) -> dict[str, type[JobRequest]]:
        return {name: cls for name, cls in sorted(self._registry.requests().items()) if cls.cron}

    async def views(self) -> list[ScheduleView]:
        overrides = await self._overrides(fresh=True)
        return [await self._view(name, cls, overrides.get(name)) for name, cls in self.schedules().items()]

    async def view(self, name: str) -> ScheduleView | None:
        request_class = self.schedules().get(name)
        if request_class is None:
            return None
        return await self._view(name, request_class, (await self._overrides(fresh=True)).get(name))

    async def fire(self, name: str, fire_at: datetime, *, replaced_only: bool = False) -> FireResult:
        """Create the run of `name` due at `fire_at`; returns what happened (for logs and tests).

        `replaced_only`: called by the per-minute override ticker, which runs only the schedules
        whose cron an override replaced (the request's own cron has arq crons of its own).
        """
        request_class = self.schedules().get(name)
        if request_class is None:
            return FireResult.UNKNOWN
        override = (await self._overrides()).get(name)
        cron, enabled, reason = self._effective(name, request_class, override)
        replaced = cron is not None and cron != request_class.cron
        if replaced != replaced_only:
            return FireResult.NOT_MINE
        if replaced_only and (cron is None or not matches(cron, fire_at.astimezone(self.timezone))):
            return FireResult.NOT_DUE
        if not enabled:
            await self._record_skip(name, fire_at, reason or "disabled")
            return FireResult.DISABLED
        return await self._enqueue(name, request_class, fire_at)

    async def tick_overrides(self, at: datetime) -> dict[str, FireResult]:
        """The per-minute tick for schedules whose cron was replaced at runtime."""
        return {name: await self.fire(name, at, replaced_only=True) for name in self.schedules()}

    async def skips(self, name: str, *, limit: int = 20) -> list[dict[str, Any]]:
        """The schedule's recent skipped ticks, newest first: {"fire_at", "reason"}."""
        raw = await self._store.redis.lrange(self._store.keys.schedule_skips(name), 0, limit - 1)  # type: ignore[misc]
        return [json.loads(item) for item in raw]

    async def _enqueue(self, name: str, request_class: type[JobRequest], fire_at: datetime) -> FireResult:
        fire_ms = int(fire_at.timestamp() * 1000)
        try:
            request = request_class()
        except TypeError as exc:
            await self._record_skip(name, fire_at, f"the request cannot be built without arguments: {exc}")
            return FireResult.INVALID
        try:
            await self._create_job(request, job_id=f"{name}@{fire_ms}", schedule_name=name)
        except RequestRefusedError as exc:
            if exc.code != RequestCode.JOB_CONCURRENT_LIMIT:
                raise
            logger.info("schedule %s: tick %s skipped, the previous run is still going", name, fire_at)
            await self._record_skip(name, fire_at, "the previous run is still going")
            return FireResult.SKIPPED
        except DuplicateJobError:
            return FireResult.DUPLICATE
        return FireResult.ENQUEUED

    async def _record_skip(self, name: str, fire_at: datetime, reason: str) -> None:
        key = self._store.keys.schedule_skips(name)
        async with self._store.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, json.dumps({"fire_at": fire_at.isoformat(), "reason": reason}))
            pipe.ltrim(key, 0, SKIPS_KEPT - 1)
            await pipe.execute()

    async def _overrides(self, *, fresh: bool = False) -> dict[str, ScheduleOverride]:
        try:
            return await self.overrides.all(fresh=fresh)
        except StorageError as exc:
            # The schedules still run from their declared crons; the operator's changes wait.
            logger.warning("schedule overrides unreadable (%s); using the declared crons", exc)
            return {}

    def _effective(
        self, name: str, request_class: type[JobRequest], override: ScheduleOverride | None
    ) -> tuple[str | None, bool, str | None]:
        """(effective cron or None if unusable, enabled, why not enabled)."""
        cron = override.cron if override is not None and override.cron else request_class.cron
        problem = cron_problem(cron) if cron else "no cron"
        if problem is not None:
            logger.error("schedule %s is disabled: its cron override %r is invalid (%s)", name, cron, problem)
            return None, False, f"invalid cron override: {problem}"
        if self._allowlist and name not in self._allowlist:
            return cron, False, "not in AGENT_SCHEDULE_ALLOWLIST"
        if override is not None and not override.enabled:
            return cron, False, f"disabled by {override.updated_by}"
        return cron, True, None

    async def _view(
        self, name: str, request_class: type[JobRequest], override: ScheduleOverride | None
    ) -> ScheduleView:
        cron, enabled, reason = self._effective(name, request_class, override)
        runs = await self._store.list_by_schedule(name, limit=1)
        now = datetime.now(self.timezone)
        return ScheduleView(
            name=name,
            default_cron=str(request_class.cron),
            override=override,
            effective_cron=cron,
            enabled=enabled,
            disabled_reason=reason,
            last_run=runs[0] if runs else None,
            next_run=next_fire(cron, now) if cron and enabled else None,
        )
