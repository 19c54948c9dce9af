"""Fan-out groups: children queued together, a sliding window of at most `max_in_flight` of them,
and a finalizer queued exactly once when the last child has ended, whatever way it ended.

Ours because no peer gets it right: Celery's chord counts results (a retried child counts twice)
and loses the callback on a crash between the last child and `callback.delay`; Dramatiq's group
callback never fires when a child fails; streaq starts a dependent in a second round trip. Here
each child is counted once by its id, inside the same Lua script as its terminal write, and that
script queues the next waiting child and the finalizer (store/lua/lib.lua, group_child_ended).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_async.engine import Engine
from agent_async.errors import GroupError
from agent_async.request import JobRequest
from agent_async.state import JobState, new_job_id
from agent_async.store import JobStore
from agent_async.store.groups import GroupRecord, GroupStatus, GroupStore, PreparedJob
from agent_async.store.schema import state_to_hash

__all__ = ["MAX_GROUP_CHILDREN", "GroupFinalizer", "GroupView", "Groups"]

# One group is created by one script call carrying every child: this bounds its size (and the
# memory Redis needs for that call, about 1 KB per child).
MAX_GROUP_CHILDREN = 10_000


@dataclass
class GroupFinalizer(JobRequest):
    """Base of a group's finalizer request (subclass it and set `name`): `group_id` is filled in
    when the group is created; the finalizer reads the counts with `resources.get_group(group_id)`."""

    group_id: str = ""


@dataclass(frozen=True, slots=True)
class GroupView:
    """What a group looks like to its caller and to its finalizer."""

    group_id: str
    status: GroupStatus
    total: int
    succeeded: int
    failed: int
    canceled: int
    in_flight: int
    waiting: int
    finalizer_job_id: str
    failed_ids: tuple[str, ...]
    cancel_requested: bool

    @property
    def done(self) -> bool:
        return self.succeeded + self.failed + self.canceled >= self.total

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "status": self.status.value,
                "failed_ids": list(self.failed_ids), "done": self.done}


def _view(record: GroupRecord) -> GroupView:
    return GroupView(
        group_id=record.group_id, status=record.status, total=record.total, succeeded=record.succeeded,
        failed=record.failed, canceled=record.canceled, in_flight=record.live, waiting=record.waiting,
        finalizer_job_id=record.finalizer_job_id, failed_ids=record.failed_ids,
        cancel_requested=record.cancel_requested_ms is not None,
    )


class Groups:
    def __init__(self, jobs: JobStore, *, groups: GroupStore, engine: Engine) -> None:
        self._jobs = jobs
        self._groups = groups
        self._engine = engine

    async def create(
        self,
        children: Sequence[JobRequest],
        finalizer: GroupFinalizer,
        *,
        user_uid: str | None = None,
        max_in_flight: int | None = None,
    ) -> str:
        """Create a group and return its id. Its children ignore their requests' max_concurrent:
        the group's `max_in_flight` is their bound. Raises GroupError before anything is written
        for more than MAX_GROUP_CHILDREN children, a max_in_flight below 1, or a finalizer that
        is not a GroupFinalizer."""
        if not isinstance(finalizer, GroupFinalizer):
            raise GroupError(f"the finalizer must be a GroupFinalizer request, not {type(finalizer).__name__}")
        if len(children) > MAX_GROUP_CHILDREN:
            raise GroupError(f"a group holds at most {MAX_GROUP_CHILDREN} children, not {len(children)}")
        if max_in_flight is not None and max_in_flight < 1:
            raise GroupError(f"max_in_flight must be at least 1, not {max_in_flight}")
        group_id = uuid.uuid4().hex
        group_key = self._jobs.keys.group(group_id)
        prepared = [self._prepare(child, user_uid, {"group": group_key}) for child in children]
        final = self._prepare(dataclasses.replace(finalizer, group_id=group_id), user_uid, {"group_of": group_id})
        await self._groups.create(
            group_id, children=prepared, finalizer=final, max_in_flight=max_in_flight or 0, user_uid=user_uid
        )
        return group_id

    async def get(self, group_id: str) -> GroupView | None:
        record = await self._groups.get(group_id)
        return None if record is None else _view(record)

    async def cancel(self, group_id: str) -> GroupView | None:
        """Cancel every child not ended yet (running ones are stopped by their worker); the
        finalizer still runs, with the counts, once the last child has ended."""
        if await self._groups.cancel(group_id) is None:
            return None
        return await self.get(group_id)

    async def finalize_pending(self) -> int:
        """The recovery pass's part: queue finalizers whose queueing failed."""
        return await self._groups.finalize_pending()

    def _prepare(self, request: JobRequest, user_uid: str | None, extra: dict[str, str]) -> PreparedJob:
        state = JobState(job_id=new_job_id(), name=request.name, user_uid=user_uid, payload=request.payload())
        engine_job = self._engine.job(state)
        ref = engine_job.ref
        fields = {
            **state_to_hash(state, resume=request.resume, max_try=request.max_try),
            **extra,
            # The group's cancel script drops a queued child from the engine's queue with these.
            "engine_queue": ref.queue_key, "engine_key": ref.job_key, "engine_id": ref.engine_job_id,
        }
        keys = self._jobs.keys
        return PreparedJob(
            job_id=state.job_id, state_key=keys.state(state.job_id), fields=fields,
            user_index=keys.user_index(user_uid) if user_uid else "", all_index=keys.all_index,
            queue_key=ref.queue_key,
            job_key=ref.job_key, engine_job_id=ref.engine_job_id, job_bytes=engine_job.job_bytes,
            ttl_ms=engine_job.ttl_ms,
        )
