"""WorkerDirectory: the worker processes alive in a namespace, each registered with an expiry."""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import asdict, dataclass

from agent_async.lifecycle import now_ms
from agent_async.store.jobs import JobStore, _reachable

__all__ = ["WorkerDirectory", "WorkerInfo"]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    worker_id: str
    host: str
    pid: int
    started_ms: int
    jobs_running: int
    heartbeat_ms: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class WorkerDirectory:
    """A worker registers at each heartbeat with a TTL of one lease: a dead one drops out by itself."""

    def __init__(self, jobs: JobStore, *, ttl_ms: int) -> None:
        self._jobs = jobs
        self._ttl_ms = ttl_ms
        self.worker_id = uuid.uuid4().hex[:12]
        self._started_ms = now_ms()

    async def beat(self, jobs_running: int) -> None:
        now = now_ms()
        info = WorkerInfo(self.worker_id, socket.gethostname(), os.getpid(), self._started_ms, jobs_running, now)
        k = self._jobs.keys
        # Not a transaction (MULTI and EXEC are two more commands per beat of every idle worker):
        # each write is whole on its own, and alive() reads only entries that have both.
        async with self._jobs.redis.pipeline(transaction=False) as pipe:
            pipe.set(k.worker(self.worker_id), json.dumps(info.to_dict()), px=self._ttl_ms)
            pipe.zadd(k.workers, {self.worker_id: now + self._ttl_ms})
            pipe.zremrangebyscore(k.workers, "-inf", now)
            await pipe.execute()

    async def leave(self) -> None:
        k = self._jobs.keys
        async with self._jobs.redis.pipeline(transaction=True) as pipe:
            pipe.delete(k.worker(self.worker_id))
            pipe.zrem(k.workers, self.worker_id)
            await pipe.execute()

    async def alive(self) -> list[WorkerInfo]:
        """The workers whose last heartbeat has not expired, oldest first."""
        k = self._jobs.keys
        redis = self._jobs.redis
        with _reachable("list workers"):
            ids = [i.decode() for i in await redis.zrangebyscore(k.workers, now_ms(), "+inf")]
            raws = await redis.mget([k.worker(i) for i in ids]) if ids else []
        infos = [WorkerInfo(**json.loads(raw)) for raw in raws if raw]
        return sorted(infos, key=lambda info: info.started_ms)
