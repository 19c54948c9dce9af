"""The library's exceptions: one root, one subclass per thing a caller may want to catch."""

from __future__ import annotations

__all__ = [
    "ERROR_JOB_CONCURRENT_LIMIT",
    "ERROR_JOB_NOT_FOUND",
    "ERROR_JOB_PAYLOAD_INVALID",
    "ERROR_JOB_UNKNOWN",
    "AgentError",
    "ConfigurationError",
    "EnqueueError",
    "JobDeclarationError",
    "QueueUnavailableError",
    "RequestException",
    "SoftTimeLimitExceeded",
    "StorageError",
    "StorageIntegrityError",
    "StorageUnavailableError",
]

ERROR_JOB_CONCURRENT_LIMIT = "job_concurrent_limit"
ERROR_JOB_UNKNOWN = "job_unknown"
ERROR_JOB_PAYLOAD_INVALID = "job_payload_invalid"
ERROR_JOB_NOT_FOUND = "job_not_found"


class AgentError(Exception):
    """Root of every exception this library raises on purpose."""


class ConfigurationError(AgentError):
    """A setting is missing or malformed; raised at start-up, before any job runs."""


class JobDeclarationError(AgentError, TypeError):
    """A JobRequest or Job class is declared wrongly; raised at import, naming the class."""


class RequestException(AgentError):
    """A request to enqueue was refused; `code` is one of the ERROR_JOB_* constants.

    The HTTP layer maps codes to statuses (concurrency limit -> 409, unknown job -> 400, ...).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class EnqueueError(AgentError):
    """Redis refused the atomic enqueue (duplicate id, corrupted keys); nothing was written."""


class QueueUnavailableError(AgentError, ConnectionError):
    """Redis cannot be reached (connection refused, timeout); the HTTP layer answers 503.

    Raised by enqueue (nothing was written) and by state reads.
    """


class SoftTimeLimitExceeded(AgentError):
    """Raised inside `Job.process()` when the request's soft_timeout_seconds has elapsed.

    The job may catch it to clean up; it is retried only if listed in the request's retry_for.
    """


class StorageError(AgentError):
    """Base of the large-blob store's errors."""


class StorageUnavailableError(StorageError, ConnectionError):
    """The storage backend cannot be reached; transient, so jobs may list it in retry_for."""


class StorageIntegrityError(StorageError):
    """A stored blob does not match its recorded hash or size: its bytes are never returned."""
