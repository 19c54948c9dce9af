"""The library's exceptions: one root, one subclass per thing a caller may want to catch."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = [
    "ERROR_JOB_CONCURRENT_LIMIT",
    "ERROR_JOB_PAYLOAD_INVALID",
    "ERROR_JOB_UNKNOWN",
    "AccessRevoked",
    "AgentError",
    "BatchEnqueueError",
    "ConfigurationError",
    "ConnectionCoolingDown",
    "DuplicateJobError",
    "EnqueueError",
    "GroupError",
    "JobDeclarationError",
    "QueueUnavailableError",
    "RequestCode",
    "RequestException",
    "RequestRefusedError",
    "SoftTimeLimitExceeded",
    "StorageError",
    "StorageIntegrityError",
    "StorageUnavailableError",
]



class RequestCode(StrEnum):
    """Why an enqueue was refused (`RequestRefusedError.code`); the values are stable API codes."""

    JOB_CONCURRENT_LIMIT = "job_concurrent_limit"
    JOB_UNKNOWN = "job_unknown"
    JOB_PAYLOAD_INVALID = "job_payload_invalid"
    # enqueue_once: the idempotency key is empty or too long; or it already names a job that
    # another request made (another payload: the key was reused for something else).
    IDEMPOTENCY_KEY_INVALID = "idempotency_key_invalid"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"


# The codes under their earlier names (each equals its RequestCode member).
ERROR_JOB_CONCURRENT_LIMIT = RequestCode.JOB_CONCURRENT_LIMIT
ERROR_JOB_UNKNOWN = RequestCode.JOB_UNKNOWN
ERROR_JOB_PAYLOAD_INVALID = RequestCode.JOB_PAYLOAD_INVALID


class AgentError(Exception):
    """Root of every exception this library raises on purpose."""


class ConfigurationError(AgentError):
    """A setting is missing or malformed; raised at start-up, before any job runs."""


class JobDeclarationError(AgentError, TypeError):
    """A JobRequest or Job class is declared wrongly; raised at import, naming the class."""


class RequestRefusedError(AgentError):
    """A request to enqueue was refused; `code` says why (a RequestCode).

    The HTTP layer maps codes to statuses (concurrency limit -> 409, unknown job -> 400, ...).
    """

    def __init__(self, code: RequestCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# The earlier name, kept for callers that catch it.
RequestException = RequestRefusedError


class EnqueueError(AgentError):
    """Redis refused the atomic enqueue (duplicate id, corrupted keys); nothing was written."""


class DuplicateJobError(EnqueueError):
    """A job with this id already exists (a schedule's tick seen by a second worker, typically)."""


class BatchEnqueueError(EnqueueError):
    """ClientAgent.enqueue_many stopped at a job Redis refused (a key of the wrong type): the jobs
    before it were queued, and `results` says which (enqueue_many's results for the requests
    before it); that job and every one after it were not."""

    def __init__(self, message: str, results: list[Any]) -> None:
        super().__init__(message)
        self.results = results


class QueueUnavailableError(AgentError, ConnectionError):
    """Redis cannot be reached (connection refused, timeout); the HTTP layer answers 503.

    Raised by state reads, and by an enqueue (or a group's) once Redis stayed unreachable for
    `AgentSettings.enqueue_resend_s`. Then the job was not queued, unless one of its sends ran in
    Redis before the connection was lost, reply unseen: `job_id` is the id it would have, to look
    up once Redis is back (`ClientAgent.get_state`); `group_id` the same for a group
    (`ClientAgent.get_group`).
    """

    def __init__(self, message: str, *, job_id: str | None = None, group_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.group_id = group_id


class ConnectionCoolingDown(AgentError):
    """A guarded outside connection refused a request at once: nothing was sent.

    Its circuit is open (cooling down after failures in a row), or half-open with its one trial
    request in flight (`trial_in_flight`). Try again after `retry_after_s` (an HTTP layer answers
    503 with Retry-After; a job may list this class in its request's retry_for).
    """

    def __init__(self, name: str, retry_after_s: float, trial_in_flight: bool = False) -> None:
        # Positional arguments kept in `args`, so the exception pickles (run_in_child sends errors back).
        super().__init__(name, retry_after_s, trial_in_flight)
        self.name = name
        self.retry_after_s = retry_after_s
        self.trial_in_flight = trial_in_flight

    def __str__(self) -> str:
        why = "its trial request is in flight" if self.trial_in_flight else "cooling down after repeated failures"
        return f"connection {self.name} refused the request ({why}): nothing sent, retry in {self.retry_after_s:.3f}s"


class SoftTimeLimitExceeded(AgentError):
    """The attempt ran past the request's soft_timeout_seconds (the job's error names it).

    It is not raised inside `Job.process()`: an exception of our own cannot be thrown into a
    running task, so `process()` sees `asyncio.CancelledError` whose message names the limit, and
    may clean up in `finally`. The attempt then ends with this error, retried only if it is listed
    in the request's retry_for.
    """


class StorageError(AgentError):
    """Base of the large-blob store's errors."""


class StorageUnavailableError(StorageError, ConnectionError):
    """The storage backend cannot be reached; transient, so jobs may list it in retry_for."""


class StorageIntegrityError(StorageError):
    """A stored blob does not match its recorded hash or size: its bytes are never returned."""


class AccessRevoked(AgentError):
    """Raised by `Job.authorize()` when the enqueuing user may no longer run this job.

    The job ends CANCELED with this reason before `process()` runs: no retry, its slot freed.
    """


class GroupError(AgentError):
    """A group that cannot be created as asked (too many children, a finalizer of the wrong kind);
    nothing was written."""
