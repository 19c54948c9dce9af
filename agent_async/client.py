"""ClientAgent: the one facade web code uses to enqueue jobs, read their state and see schedules."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_async.agent import Agent
from agent_async.canceller import JobCanceller
from agent_async.engine import QueueStats
from agent_async.errors import (
    BatchEnqueueError,
    DuplicateJobError,
    EnqueueError,
    RequestCode,
    RequestRefusedError,
    StorageError,
)
from agent_async.groups import GroupFinalizer, GroupView
from agent_async.lifecycle import JobStatus
from agent_async.request import JobRequest
from agent_async.runs import RunRecord
from agent_async.schedules.scheduler import Scheduler
from agent_async.state import JobState, keyed_job_id, new_job_id
from agent_async.store.enqueue import MAX_BATCH as ENQUEUE_BATCH
from agent_async.store.enqueue import BatchReply, PreparedEnqueue
from agent_async.store.events import JobEvent
from agent_async.store.listing import JobListing, JobPage
from agent_async.store.types import GateClaim
from agent_async.store.workers import WorkerDirectory, WorkerInfo

if TYPE_CHECKING:
    from agent_async.storage import ClientStorage

__all__ = ["ClientAgent", "EnqueueResult", "EnqueuedOnce"]

logger = logging.getLogger(__name__)

# Building a batch gives the event loop a turn this often (jobs), so that the batch in flight is
# written out while the next one is built, not after.
_YIELD_EVERY = 50

# An idempotency key's length at most (characters): it is hashed into the job's id, never stored.
MAX_IDEMPOTENCY_KEY_CHARS = 255

# One request of a batch, ready to send: its index in the caller's list, its state, its slot, its script.
_Prepared = tuple[int, JobState, "GateClaim | None", PreparedEnqueue]


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """One request of `enqueue_many`: queued under `job_id`, or refused with `code` and why."""

    job_id: str | None
    code: RequestCode | None = None
    reason: str = ""

    @property
    def accepted(self) -> bool:
        return self.job_id is not None


def _same_json(a: Any, b: Any) -> bool:
    # As stored: a tuple reads back as a list, and key order is not content.
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@dataclass(frozen=True, slots=True)
class EnqueuedOnce:
    """`enqueue_once`'s answer: the job of the key, and whether an earlier call had queued it."""

    job_id: str
    replayed: bool


class ClientAgent:
    """Enqueue, read, list and cancel jobs. The large store is injected (default: the agent's)."""

    def __init__(self, agent: Agent, *, store: ClientStorage | None = None) -> None:
        self.agent = agent
        self._jobs = agent.job_store
        self.listing = JobListing(agent.job_store)
        self._store = store
        self._canceller = JobCanceller(
            agent.job_store, engine_ref=agent.engine.ref, cancel_grace_s=agent.settings.cancel_grace_s
        )

    async def enqueue(self, request: JobRequest, user_uid: str | None = None, *, defer_s: float = 0.0) -> str:
        """Queue a job and return its id at once.

        Raises RequestRefusedError (JOB_CONCURRENT_LIMIT) when the request's max_concurrent jobs
        are already in flight for this user (or globally without a user), RequestRefusedError
        (JOB_PAYLOAD_INVALID) when the payload is not JSON and EnqueueError when Redis refuses: in
        each case nothing was written. While Redis is unreachable the enqueue is sent again for
        `AgentSettings.enqueue_resend_s` (a send whose reply was lost is recognised: the job is
        queued once), then QueueUnavailableError: nothing was written, unless by a send whose reply
        was lost; its `job_id` says which job to look for.
        """
        state = await self.agent.create_job(request, user_uid=user_uid, defer_s=defer_s)
        return state.job_id

    async def enqueue_once(
        self, request: JobRequest, user_uid: str | None = None, *, key: str, defer_s: float = 0.0
    ) -> EnqueuedOnce:
        """Queue a job once per idempotency `key` (a client's retry of a request whose answer it
        never saw): the first call queues it, a later call with the same key, job name, user and
        payload gets the same job back (`replayed`), for as long as the job's state is kept
        (AgentSettings.state_retention_s). The job's id is derived from the key (`keyed_job_id`).

        Raises what `enqueue` raises, and RequestRefusedError with IDEMPOTENCY_KEY_INVALID (an
        empty key, or one over 255 characters) or IDEMPOTENCY_KEY_REUSED (the key names a job of
        another payload). A refused call queues nothing, and the key can be used again.
        """
        if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY_CHARS:
            why = f"an idempotency key has 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters"
            raise RequestRefusedError(RequestCode.IDEMPOTENCY_KEY_INVALID, why)
        job_id = keyed_job_id(request.name, user_uid, key)
        try:
            await self.agent.create_job(request, user_uid=user_uid, job_id=job_id, defer_s=defer_s)
        except DuplicateJobError:
            existing = await self.get_state(job_id)
            if existing is None:
                # Only arq's record is left (its state expired this very moment): not this key's job.
                raise
            if not _same_json(existing.payload, request.payload()):
                raise RequestRefusedError(
                    RequestCode.IDEMPOTENCY_KEY_REUSED,
                    f"{request.name}: this idempotency key was used for another request (job {job_id})",
                ) from None
            return EnqueuedOnce(job_id, replayed=True)
        return EnqueuedOnce(job_id, replayed=False)

    async def enqueue_many(
        self, requests: Sequence[JobRequest], user_uid: str | None = None, *, defer_s: float = 0.0
    ) -> list[EnqueueResult]:
        """Queue many jobs in one round trip per 100; one result per request, in order.

        Each job is queued exactly as `enqueue` would (its own gate check, all or nothing for that
        job): a refusal (RequestRefusedError's codes: concurrency limit, payload not JSON) is its
        result, not an exception. Each round trip is sent again while Redis is unreachable, as
        `enqueue` is. QueueUnavailableError when Redis stays down, EnqueueError when it refuses a
        round trip: then no job of it, or after it, was queued (earlier ones were), unless by a
        send whose reply was lost. A job that Redis refuses alone (a duplicate id, a key of the
        wrong type) raises BatchEnqueueError (an EnqueueError): the jobs before it were queued (its
        `results` say which), it and those after it were not.
        """
        results: list[EnqueueResult] = [EnqueueResult(None)] * len(requests)
        batches = [range(start, min(start + ENQUEUE_BATCH, len(requests)))
                   for start in range(0, len(requests), ENQUEUE_BATCH)]
        # The next batch is built while Redis runs the one in flight (building is as long as Redis's
        # work on it); it is sent only once that one is answered, so a failure still means no job
        # of the failing round trip, and none after it, was queued.
        prepared = await self._prepare(requests, batches[0], user_uid, defer_s, results) if batches else []
        for k in range(len(batches)):
            in_flight = asyncio.ensure_future(self._send(prepared))
            try:
                following = (await self._prepare(requests, batches[k + 1], user_uid, defer_s, results)
                             if k + 1 < len(batches) else [])
            finally:
                replies = await in_flight
            self._settle(prepared, replies, results)
            prepared = following
        return results

    async def _prepare(
        self, requests: Sequence[JobRequest], indexes: range, user_uid: str | None, defer_s: float,
        results: list[EnqueueResult],
    ) -> list[_Prepared]:
        prepared = []
        for i in indexes:
            if i % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # the batch in flight is written (and its reply read) meanwhile
            request = requests[i]
            try:
                state = JobState(job_id=new_job_id(), name=request.name, user_uid=user_uid,
                                 payload=request.payload())
                gate = self.agent.gate_claim(type(request), user_uid)
                call = self._jobs.prepare(
                    state, gate=gate, run=self.agent.engine.run_at(defer_s), resume=request.resume,
                    max_try=request.max_try, owned_blobs=request.owned_blob_refs(), new_id=True,
                )
            except RequestRefusedError as exc:
                results[i] = EnqueueResult(None, exc.code, str(exc))
                continue
            prepared.append((i, state, gate, call))
        return prepared

    async def _send(self, prepared: list[_Prepared]) -> BatchReply:
        return await self._jobs.create_many([call for *_, call in prepared]) if prepared else BatchReply([])

    def _settle(self, prepared: list[_Prepared], batch: BatchReply, results: list[EnqueueResult]) -> None:
        for (i, state, gate, _), reply in zip(prepared, batch.replies, strict=False):
            try:
                self._jobs.check_created(state, gate, reply)
            except RequestRefusedError as exc:
                results[i] = EnqueueResult(None, exc.code, str(exc))
            except EnqueueError as exc:  # the batch stopped here (enqueue.lua)
                raise BatchEnqueueError(str(exc), results[:i]) from exc
            else:
                results[i] = EnqueueResult(state.job_id)
        if batch.error is not None:
            stopped = prepared[len(batch.replies)][0]
            raise BatchEnqueueError(f"could not enqueue: {batch.error}", results[:stopped])

    async def enqueue_named(
        self, name: str, payload: dict[str, Any], user_uid: str | None = None, *, defer_s: float = 0.0
    ) -> str:
        """Enqueue by job name and payload dict (for callers that do not import the request class)."""
        request_class = self.agent.registry.request(name)
        if request_class is None:
            raise RequestRefusedError(RequestCode.JOB_UNKNOWN, f"no job is named {name!r}")
        return await self.enqueue(request_class.from_payload(payload), user_uid, defer_s=defer_s)

    async def enqueue_group(
        self,
        children: Sequence[JobRequest],
        finalizer: GroupFinalizer,
        *,
        user_uid: str | None = None,
        max_in_flight: int | None = None,
    ) -> str:
        """Queue children and a finalizer that runs exactly once after the last child has ended
        (see agent_async.groups); returns the group id. All or nothing; resent as `enqueue` is."""
        return await self.agent.groups.create(children, finalizer, user_uid=user_uid, max_in_flight=max_in_flight)

    async def get_group(self, group_id: str) -> GroupView | None:
        return await self.agent.groups.get(group_id)

    async def cancel_group(self, group_id: str) -> GroupView | None:
        return await self.agent.groups.cancel(group_id)

    async def get_state(self, job_id: str) -> JobState | None:
        return await self._jobs.get(job_id)

    async def list_for_user(self, user_uid: str, *, offset: int = 0, limit: int = 50) -> list[JobState]:
        """The user's jobs, newest first."""
        return await self._jobs.list_for_user(user_uid, offset=offset, limit=limit)

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        name: str | None = None,
        user_uid: str | None = None,
        limit: int = 50,
        scan_limit: int = 5000,
    ) -> list[JobState]:
        """Jobs of every user, newest first, filtered; looks at no more than `scan_limit` jobs."""
        found: list[JobState] = []
        for offset in range(0, scan_limit, 500):
            page = await self._jobs.list_all(offset=offset, limit=min(500, scan_limit - offset))
            found += [
                s for s in page
                if (status is None or s.status == status) and (name is None or s.name == name)
                and (user_uid is None or s.user_uid == user_uid)
            ]
            if len(found) >= limit or len(page) < 500:
                break
        return found[:limit]

    async def list_page(
        self,
        *,
        status: JobStatus | None = None,
        name: str | None = None,
        user_uid: str | None = None,
        cursor: int = 0,
        limit: int = 50,
        scan_limit: int = 5000,
    ) -> JobPage:
        """A page of every user's jobs, filtered, read from indexes (see JobStore.list_page);
        the next page starts at `page.next_cursor`."""
        return await self.listing.list_page(
            status=status, name=name, user_uid=user_uid, cursor=cursor, limit=limit, scan_limit=scan_limit
        )

    async def retry(self, job_id: str) -> str | None:
        """Queue a FAILURE or CANCELED job again under a new id, same request and user; the new
        state names the old one (`retry_of`). None for an unknown id; RequestRefusedError if the job
        has not ended in failure or cancel, or its request is not registered here."""
        state = await self.get_state(job_id)
        if state is None:
            return None
        if state.status not in (JobStatus.FAILURE, JobStatus.CANCELED):
            message = f"job {job_id} is {state.status}: only a FAILURE or CANCELED job can be retried"
            raise RequestRefusedError(RequestCode.JOB_PAYLOAD_INVALID, message)
        request_class = self.agent.registry.request(state.name)
        if request_class is None:
            raise RequestRefusedError(RequestCode.JOB_UNKNOWN, f"no job is named {state.name!r}")
        new = await self.agent.create_job(request_class.from_payload(state.payload), user_uid=state.user_uid,
                                          retry_of=job_id)
        return new.job_id

    async def queue_stats(self) -> QueueStats:
        return await self.agent.engine.queue_stats()

    async def count_for_user(self, user_uid: str) -> int:
        """How many jobs the user has within the retention (the length of `list_for_user`'s index)."""
        return await self._jobs.count_for_user(user_uid)

    async def list_by_schedule(self, schedule_name: str, *, offset: int = 0, limit: int = 50) -> list[JobState]:
        return await self._jobs.list_by_schedule(schedule_name, offset=offset, limit=limit)

    async def cancel(self, job_id: str, *, wait_s: float | None = None) -> JobState | None:
        """Cancel a job (see JobCanceller): queued ones never run, running ones are stopped.

        Idempotent: a terminal job is returned unchanged; None for an unknown id. Once the job has
        ended, the blobs it owns (JobRequest.owned_blobs) are deleted.
        """
        state = await self._canceller.cancel(job_id, wait_s=wait_s)
        if state is not None and state.is_terminal:
            await self.agent.owned_blobs.release(job_id)
            if state.status is JobStatus.CANCELED:
                await self._record_cancelled_runs(job_id)
        return state

    async def cancel_run(self, run: RunRecord, *, reason: str, wait_s: float | None = None) -> RunRecord:
        """Cancel a running run: record it `cancelled` with `reason`, then cancel its group (queued and
        waiting items canceled, running ones stopped; the finalizer still runs and leaves the record
        alone) and its job. Returns the record as stored (an ended run is left as it is)."""
        ended = await self.agent.runs.cancel(run.run_id, reason=reason)
        if run.group_id is not None:
            await self.cancel_group(run.group_id)
        if run.job_id is not None:
            await self.cancel(run.job_id, wait_s=wait_s)
        return ended

    async def _record_cancelled_runs(self, job_id: str) -> None:
        try:
            await self.agent.runs.cancel_for_job(job_id, reason="cancelled through the canceller")
        except StorageError as exc:
            logger.info("job %s: run records not updated (%s)", job_id, exc)

    async def events(
        self,
        *,
        job_id: str | None = None,
        name: str | None = None,
        user_uid: str | None = None,
        status: JobStatus | None = None,
        last_event_id: str | None = None,
        idle_s: float = 15.0,
    ) -> AsyncIterator[JobEvent | None]:
        """The namespace's job events as they happen (transitions and progress), filtered.

        With `last_event_id` (a reconnecting reader's last seen id), every event after it that is
        still kept is replayed first. For one job (`job_id`), the stream starts at the job's
        creation and ends after its terminal event. Yields None after `idle_s` without an event,
        so a server can send a heartbeat. Ends at once for an unknown job.
        """
        after = last_event_id
        if job_id is not None and after is None:
            state = await self.get_state(job_id)
            if state is None:
                return
            after = f"{max(0, state.created_ms - 1)}-0"
        if after is None:
            after = await self.agent.events.last_id()
        while True:
            batch = await self.agent.events.read(after, count=200, block_ms=int(idle_s * 1000))
            if not batch:
                yield None
                continue
            for event in batch:
                after = event.event_id
                if _matches(event, job_id=job_id, name=name, user_uid=user_uid, status=status):
                    yield event
                    if job_id is not None and event.is_terminal:
                        return

    async def workers(self) -> list[WorkerInfo]:
        """The worker processes alive now (registered at each heartbeat, expiring after a lease)."""
        return await WorkerDirectory(self._jobs, ttl_ms=0).alive()

    async def ping(self) -> None:
        """Raise QueueUnavailableError unless Redis answers (a health check)."""
        await self._jobs.ping()

    @property
    def schedules(self) -> Scheduler:
        """The periodic jobs: views, skips, runtime overrides (`schedules.overrides`)."""
        return self.agent.scheduler

    def get_large_store(self) -> ClientStorage:
        return self._store if self._store is not None else self.agent.get_large_store()


def _matches(
    event: JobEvent, *, job_id: str | None, name: str | None, user_uid: str | None, status: JobStatus | None
) -> bool:
    return (
        (job_id is None or event.job_id == job_id)
        and (name is None or event.name == name)
        and (user_uid is None or event.user_uid == user_uid)
        and (status is None or event.status == status)
    )
