"""Serializer base and JobStateSerializerDict: the owner-facing view of a JobState at the API boundary."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

from agent_async.registry import JobRegistry
from agent_async.state import JobState

if TYPE_CHECKING:
    from agent_async.job import Job, JobResources

__all__ = ["LARGE_RESULT_KEY", "JobStateSerializerDict", "PublicJobState", "Serializer", "public_result"]

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


class PublicJobState(TypedDict):
    """What a job's owner sees: never its id, name, user, attempts or dates."""

    status: str
    payload: dict[str, Any] | None
    result: dict[str, Any] | None
    error: str | None


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
