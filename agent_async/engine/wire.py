"""arq's wire format and key names: JSON job bytes, engine job ids under the namespace, arq's keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arq.constants import expires_extra_ms, in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.jobs import serialize_job

from agent_async.store import EngineRef, codec

__all__ = [
    "WAKE_CAP", "WAKE_SUFFIX", "WAKE_TTL_MS", "Dropped", "EngineNames", "dropped_from_result", "serialize",
    "wire_dumps", "wire_loads",
]

# arq's in-progress key lives this long past its longest function timeout (arq/worker.py:
# `in_progress_timeout_s = (max_timeout or 0) + 10`; arq does not export the 10).
IN_PROGRESS_EXTRA_S = 10
# How long arq keeps a queued job's key past its run time, unless told otherwise.
JOB_TTL_EXTRA_MS: int = expires_extra_ms

# Push wake-up (engine/wakeup.py): each job made runnable drops one token in the queue's wake list,
# which idle fast workers block on. Busy workers do not read it, so it is capped (a worker going
# idle would otherwise churn through stale tokens) and expires (no worker at all reads it).
WAKE_CAP = 16
WAKE_TTL_MS = 60_000
# The Lua spelling of `EngineNames.wake_key` (queue.lua derives the key from the queue's name).
WAKE_SUFFIX = ":wake"


def wire_dumps(value: Any) -> bytes:
    """arq job_serializer: JSON instead of pickle, so nothing read from Redis can run code."""
    return codec.dumps_bytes(value, exceptions=True)


def wire_loads(raw: bytes) -> Any:
    return codec.loads(raw)


def serialize(function: str, payload: dict[str, Any], enqueue_time_ms: int) -> bytes:
    """The bytes of an arq job calling `function(payload)`."""
    return serialize_job(function, (payload,), {}, None, enqueue_time_ms, serializer=wire_dumps)


@dataclass(frozen=True, slots=True)
class EngineNames:
    """arq's names for this namespace's jobs.

    arq's per-job keys (`arq:job:<id>`, `arq:in-progress:<id>`, ...) are global: the engine job id
    `<namespace>:<job id>` makes them distinct per namespace. Cron ticks are arq jobs too, with
    ids `<namespace>:cron:<schedule>:<i>:<fire ms>`; they create tracked runs, they are not ones.
    """

    namespace: str

    @property
    def queue(self) -> str:
        return f"{self.namespace}:queue"

    @property
    def wake_key(self) -> str:
        """The list idle fast workers block on: one token per job made runnable (queue.lua)."""
        return self.queue + WAKE_SUFFIX

    def engine_job_id(self, job_id: str) -> str:
        return f"{self.namespace}:{job_id}"

    def job_id(self, engine_job_id: str) -> str | None:
        """The job id of one of our engine job ids; None for an id of another namespace."""
        prefix = f"{self.namespace}:"
        return engine_job_id[len(prefix):] if engine_job_id.startswith(prefix) else None

    def ref(self, job_id: str) -> EngineRef:
        engine_id = self.engine_job_id(job_id)
        return EngineRef(
            queue_key=self.queue,
            job_key=job_key_prefix + engine_id,
            claim_key=in_progress_key_prefix + engine_id,
            engine_job_id=engine_id,
        )

    def result_key(self, job_id: str) -> str:
        return result_key_prefix + self.engine_job_id(job_id)

    def in_progress_key(self, engine_job_id: str) -> str:
        return in_progress_key_prefix + engine_job_id

    def cron_function(self, schedule_name: str, index: int) -> str:
        """Name of the arq cron function `index` of a schedule (its ticks' arq job ids start so)."""
        return f"{self.namespace}:cron:{schedule_name}:{index}"

    @property
    def override_ticker(self) -> str:
        return f"{self.namespace}:cron:_overrides"

    def is_cron_tick(self, engine_job_id: str) -> bool:
        return engine_job_id.startswith(f"{self.namespace}:cron:")


@dataclass(frozen=True, slots=True)
class Dropped:
    """Why arq dropped a job without running it to the end (no hook sees this)."""

    reason: str
    # arq's result is a CancelledError: the job was aborted, not failed.
    canceled: bool = False


def dropped_from_result(raw: bytes | None) -> Dropped | None:
    """What arq's stored result of a dropped job says, or None if it stored none."""
    if not raw:
        return None
    try:
        result = codec.loads(raw).get("r")
    except (ValueError, AttributeError):
        return Dropped("unreadable engine result")
    if isinstance(result, dict) and "exc_type" in result:
        message = result.get("message") or ""
        reason = f"{result['exc_type']}: {message}" if message else str(result["exc_type"])
        return Dropped(reason, canceled=result["exc_type"] == "CancelledError")
    return Dropped(str(result))
