"""GroupStore: a fan-out group's Redis layout and its scripts (creation, cancel, finalizer retry).

A child's terminal transition does the group's accounting in whichever script ends it (lib.lua's
end_job -> group_child_ended): counted once by id, the next waiting child released, the finalizer
queued after the last one, all inside that one script.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agent_async.errors import DuplicateJobError, QueueUnavailableError
from agent_async.lifecycle import now_ms
from agent_async.outage import send_through_outage
from agent_async.store import codec
from agent_async.store.jobs import JobStore, _reachable
from agent_async.store.scripts import run_script, store_script

__all__ = ["GroupRecord", "GroupStatus", "GroupStore", "PreparedJob"]


class GroupStatus(StrEnum):
    RUNNING = "running"
    FINALIZED = "finalized"  # the finalizer is queued (or ran)
    FINAL_PENDING = "final_pending"  # queueing the finalizer failed; the recovery pass retries


@dataclass(frozen=True, slots=True)
class PreparedJob:
    """A job whose state and engine job a script creates later (a waiting child, a finalizer)."""

    job_id: str
    state_key: str
    fields: dict[str, str]
    user_index: str
    all_index: str
    queue_key: str
    job_key: str
    engine_job_id: str
    job_bytes: bytes
    ttl_ms: int

    def to_json(self) -> str:
        flat = [item for pair in self.fields.items() for item in pair]
        # ensure_ascii=False: the job's bytes go through cjson unchanged (they are UTF-8 JSON).
        return json.dumps(
            {
                "id": self.job_id, "state": self.state_key, "fields": flat, "user_idx": self.user_index,
                "all_idx": self.all_index,
                "queue": self.queue_key, "job_key": self.job_key, "engine_id": self.engine_job_id,
                "bytes": self.job_bytes.decode(), "ttl_ms": self.ttl_ms,
            },
            ensure_ascii=False, separators=(",", ":"),
        )


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A group's hash as stored."""

    group_id: str
    status: GroupStatus
    total: int
    ended: int
    succeeded: int
    failed: int
    canceled: int
    live: int
    waiting: int
    max_in_flight: int
    user_uid: str | None
    finalizer_job_id: str
    failed_ids: tuple[str, ...]
    created_ms: int
    fired_ms: int | None
    cancel_requested_ms: int | None


class GroupStore:
    def __init__(self, jobs: JobStore, *, engine_lua: str) -> None:
        self._jobs = jobs
        self._create = store_script(
            "group_create.lua", engine_lua, events_key=jobs.events_key, metrics_key=jobs.metrics_key, packed=True
        )
        self._cancel = store_script(
            "group_cancel.lua", engine_lua, events_key=jobs.events_key, metrics_key=jobs.metrics_key, packed=True
        )
        self._finalize = store_script(
            "group_finalize.lua", engine_lua, events_key=jobs.events_key, metrics_key=jobs.metrics_key
        )

    async def create(
        self,
        group_id: str,
        *,
        children: Sequence[PreparedJob],
        finalizer: PreparedJob,
        max_in_flight: int,
        user_uid: str | None,
    ) -> int:
        """Write the group, its first children and the rest as waiting, all or nothing.

        Sent again while Redis is unreachable, as an enqueue is (`JobStore.enqueue_resend_s`): a
        resend that finds the group its earlier send created (reply lost) answers as that send
        did. Past that budget QueueUnavailableError, with the group's id in `group_id`."""
        k = self._jobs.keys
        keys = [k.group(group_id), k.active_index, k.groups_final_pending]
        head: list[str | int] = [
            group_id, now_ms(), self._jobs.retention_s, max_in_flight, user_uid or "", finalizer.job_id,
            finalizer.to_json(),
        ]
        specs = [child.to_json() for child in children]

        async def send(resent: bool) -> int:
            with _reachable(f"create group {group_id}"):
                call = self._create(keys, [*head, "1" if resent else "", *specs])
                return int(await run_script(self._jobs.redis, call))

        try:
            queued = await send_through_outage(
                send, for_s=self._jobs.enqueue_resend_s, errors=(QueueUnavailableError,)
            )
        except QueueUnavailableError as exc:
            raise QueueUnavailableError(str(exc), group_id=group_id) from exc
        if queued < 0:
            raise DuplicateJobError(f"group id {group_id} already exists")
        return queued

    async def get(self, group_id: str) -> GroupRecord | None:
        key = self._jobs.keys.group(group_id)
        with _reachable(f"read group {group_id}"):
            async with self._jobs.redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(key)
                pipe.scard(f"{key}:live")
                pipe.llen(f"{key}:waiting")
                pipe.lrange(f"{key}:failed", 0, -1)
                raw, live, waiting, failed = await pipe.execute()
        if not raw:
            return None
        h = {name.decode(): value.decode() for name, value in raw.items()}
        return GroupRecord(
            group_id=h["id"], status=GroupStatus(h["status"]), total=int(h["total"]), ended=int(h["ended"]),
            succeeded=int(h["succeeded"]), failed=int(h["failed"]), canceled=int(h["canceled"]), live=int(live),
            waiting=int(waiting), max_in_flight=int(h["max_in_flight"]), user_uid=h["user"] or None,
            finalizer_job_id=h["final_id"], failed_ids=tuple(item.decode() for item in failed),
            created_ms=int(h["created_ms"]), fired_ms=_opt_int(h.get("fired_ms")),
            cancel_requested_ms=_opt_int(h.get("cancel_requested_ms")),
        )

    async def cancel(self, group_id: str) -> tuple[GroupStatus, int] | None:
        """Cancel the group's children (see group_cancel.lua): its status after, and how many
        running children were asked to stop. None if there is no such group."""
        k = self._jobs.keys
        with _reachable(f"cancel group {group_id}"):
            reply: list[Any] = await run_script(self._jobs.redis, self._cancel(
                [k.group(group_id), k.active_index, k.leases],
                [now_ms(), self._jobs.retention_s, k.cancel_channel, k.state("")],
            ))
        status = codec.text(reply[0])
        return None if not status else (GroupStatus(status), int(reply[1]))

    async def finalize_pending(self, *, limit: int = 100) -> int:
        """Queue the finalizers that could not be queued before; returns how many were."""
        k = self._jobs.keys
        redis = self._jobs.redis
        group_ids = [codec.text(gid) for gid in await redis.zrange(k.groups_final_pending, 0, limit - 1)]
        queued = 0
        for group_id in group_ids:
            reply = int(await run_script(
                redis, self._finalize([k.group(group_id), k.active_index], [now_ms(), self._jobs.retention_s])
            ))
            if reply == 1:
                queued += 1
            elif reply == 0:
                await redis.zrem(k.groups_final_pending, group_id)  # settled meanwhile, or expired
        return queued


def _opt_int(value: str | None) -> int | None:
    return int(value) if value else None

