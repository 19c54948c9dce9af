"""JobRegistry: which JobRequest and Job classes exist, by job name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agent_async.errors import JobDeclarationError

if TYPE_CHECKING:
    from agent_async.job import Job
    from agent_async.request import JobRequest

__all__ = ["JobRegistry", "registry"]


class JobRegistry:
    """Requests register themselves when their class is created; jobs through `@agent_job`."""

    def __init__(self) -> None:
        self._requests: dict[str, type[JobRequest]] = {}
        self._jobs: dict[str, type[Job[Any]]] = {}

    def add_request(self, cls: type[JobRequest]) -> None:
        existing = self._requests.get(cls.name)
        if existing is not None and _qualname(existing) != _qualname(cls):
            raise JobDeclarationError(
                f"{_qualname(cls)}: job name {cls.name!r} is already used by {_qualname(existing)}"
            )
        # Re-importing the same module (reload, discovery after a direct import) replaces the class.
        self._requests[cls.name] = cls

    def add_job(self, cls: type[Job[Any]]) -> None:
        name = cls.request_class.name
        existing = self._jobs.get(name)
        if existing is not None and _qualname(existing) != _qualname(cls):
            raise JobDeclarationError(
                f"{_qualname(cls)}: a Job for {name!r} is already registered ({_qualname(existing)})"
            )
        self._jobs[name] = cls

    def request(self, name: str) -> type[JobRequest] | None:
        return self._requests.get(name)

    def job(self, name: str) -> type[Job[Any]] | None:
        return self._jobs.get(name)

    def requests(self) -> dict[str, type[JobRequest]]:
        return dict(self._requests)

    def jobs(self) -> dict[str, type[Job[Any]]]:
        return dict(self._jobs)

    @contextmanager
    def scoped(self) -> Iterator[JobRegistry]:
        """Forget whatever is registered inside the block (tests declare throw-away jobs)."""
        requests, jobs = dict(self._requests), dict(self._jobs)
        try:
            yield self
        finally:
            self._requests, self._jobs = requests, jobs


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# The process-wide registry that class declarations fill in.
registry = JobRegistry()
