"""Serializer base and JobStateSerializerDict: the owner-facing view of a JobState at the API boundary."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

from agent_async.registry import JobRegistry
from agent_async.state import JobState

if TYPE_CHECKING:
    from agent_async.job import Job, JobResources

__all__ = [
    "LARGE_RESULT_KEY",
    "JobStateSerializerDict",
    "PublicJobState",
    "PublicProgress",
    "Serializer",
    "public_progress",
    "public_result",
]

logger = logging.getLogger(__name__)

_ModelT = TypeVar("_ModelT", contravariant=True)
_OutT = TypeVar("_OutT", covariant=True)

# The result key holding the large store's reference: an internal locator, never shown.
LARGE_RESULT_KEY = "large_result"


class Serializer(ABC, Generic[_ModelT, _OutT]):
    """Converts a model to an external format exposed at the API (not the internal Redis transport)."""

    @abstractmethod
    def dump(self, model: _ModelT) -> _OutT:
        """The external form of `model`."""


class PublicProgress(TypedDict):
    """What the job last said of its progress (report_progress); `updated_at` is ISO 8601 (UTC)."""

    fraction: float
    message: str | None
    details: dict[str, Any]
    updated_at: str


class PublicJobState(TypedDict):
    """What a job's owner sees: never its id, name, user, attempts or dates (progress has its own time)."""

    status: str
    payload: dict[str, Any] | None
    result: dict[str, Any] | None
    error: str | None
    progress: PublicProgress | None


class JobStateSerializerDict(Serializer[JobState, PublicJobState]):
    """The public view of a JobState: status, redacted payload, result without large_result, error.

    The payload goes through the registered Job's `public_payload`. A job with no Job class in this
    process (the API did not import its module) or whose `public_payload` raises has its payload
    withheld (None): the serializer fails closed rather than risk showing a secret.
    """

    def __init__(self, job_registry: JobRegistry, *, resources: JobResources) -> None:
        self._registry = job_registry
        self._resources = resources
        # One Job instance per name, as a worker keeps one; public_payload needs no connection.
        self._jobs: dict[str, Job[Any] | None] = {}

    def dump(self, model: JobState) -> PublicJobState:
        return {
            "status": model.status.value,
            "payload": self._public_payload(model),
            "result": public_result(model.result),
            "error": model.error,
            "progress": public_progress(model.progress),
        }

    def _job(self, name: str) -> Job[Any] | None:
        if name not in self._jobs:
            job_class = self._registry.job(name)
            self._jobs[name] = None if job_class is None else job_class(self._resources)
        return self._jobs[name]

    def _public_payload(self, state: JobState) -> dict[str, Any] | None:
        job = self._job(state.name)
        if job is None:
            logger.warning("job %s: no Job registered for %r, payload withheld", state.job_id, state.name)
            return None
        try:
            # A copy, so a public_payload that mutates in place cannot alter the stored state.
            return dict(job.public_payload(dict(state.payload)))
        except Exception:
            logger.exception("job %s: public_payload of %r failed, payload withheld", state.job_id, state.name)
            return None


def public_result(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The result without its large-store reference (fetched through the result endpoint instead)."""
    if result is None:
        return None
    return {key: value for key, value in result.items() if key != LARGE_RESULT_KEY}


def public_progress(progress: dict[str, Any] | None) -> PublicProgress | None:
    """The job's last progress report, or None if it has not reported any (or the record is unreadable).

    `details` are shown as the result is: both are written by the job's own code for its owner (the
    payload, which the client wrote and which may hold secrets, is what goes through public_payload).
    """
    if not isinstance(progress, dict):
        return None
    try:
        fraction = float(progress["fraction"])
        updated_at = datetime.fromtimestamp(int(progress["updated_ms"]) / 1000, UTC).isoformat()
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        logger.warning("unreadable progress record withheld: %r", sorted(progress))
        return None
    message = progress.get("message")
    details = progress.get("details")
    return {
        "fraction": fraction,
        "message": message if isinstance(message, str) and message else None,
        "details": dict(details) if isinstance(details, dict) else {},
        "updated_at": updated_at,
    }
