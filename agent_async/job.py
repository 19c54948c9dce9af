"""Job: the worker side of a JobRequest; `@agent_job` registers it, `init_jobs` discovers modules."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from agent_async.errors import AgentError, ConfigurationError, JobDeclarationError
from agent_async.registry import registry
from agent_async.request import JobRequest

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from agent_async.groups import Groups
    from agent_async.settings import AgentSettings
    from agent_async.storage import ClientStorage

__all__ = ["Job", "JobResources", "agent_job", "init_jobs"]

logger = logging.getLogger(__name__)

_JobT = TypeVar("_JobT", bound="type[Job[Any]]")
RequestT = TypeVar("RequestT", bound=JobRequest)


class JobResources:
    """What a Job may use besides its request: the settings, the Redis client, the large store.

    Built by the Agent; the Redis client and the store are reached lazily, so a Job built only
    for `public_payload` (the API's serializer) opens nothing.
    """

    def __init__(
        self,
        settings: AgentSettings,
        *,
        redis: Callable[[], Redis],
        large_store: Callable[[], ClientStorage],
        groups: Groups | None = None,
    ) -> None:
        self.settings = settings
        self._redis = redis
        self._large_store = large_store
        self._groups = groups

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def redis(self) -> Redis:
        return self._redis()

    def large_store(self) -> ClientStorage:
        """The large-blob store, scoped to the agent source."""
        return self._large_store()

    @property
    def groups(self) -> Groups:
        """Fan-out groups, from inside a job: `await self.resources.groups.create(children, finalizer)`,
        and a finalizer's counts: `await self.resources.groups.get(request.group_id)`."""
        if self._groups is None:
            raise AgentError("these resources were built without groups")
        return self._groups


class Job(Generic[RequestT]):
    """Runs one kind of request. One instance per worker process, built with the worker's resources.

    `process` receives the request rebuilt from the payload (an instance of `request_class`).
    It must be idempotent: delivery is at least once (a run interrupted by a crash or a shutdown
    may run again), so key side effects by something stable such as `job_id`.
    """

    request_class: ClassVar[type[JobRequest]]

    def __init__(self, resources: JobResources) -> None:
        self.resources = resources

    async def authorize(self, request: RequestT, *, user_uid: str, job_id: str) -> None:
        """Check, in the worker and just before `process()`, that the user who enqueued the job may
        still run it (access can be revoked while it waits in the queue); raise AccessRevoked if
        not. Called only for jobs that have a user. The default allows everything."""

    async def process(self, request: RequestT, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        """Do the work; return a small JSON-safe dict (or {"large_result": ref, ...})."""
        raise NotImplementedError

    def public_payload(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The payload as shown to its owner over the API; override to redact secrets or locators."""
        return payload


def agent_job(cls: _JobT) -> _JobT:
    """Class decorator: register a Job under its request's name."""
    request_class = getattr(cls, "request_class", None)
    where = f"{cls.__module__}.{cls.__qualname__}"
    if not (isinstance(request_class, type) and issubclass(request_class, JobRequest)):
        raise JobDeclarationError(f"{where}: request_class must be a JobRequest subclass")
    if "name" not in request_class.__dict__:
        raise JobDeclarationError(f"{where}: {request_class.__qualname__} has no name of its own")
    if "process" not in {k for c in cls.__mro__[:-1] if c is not Job for k in c.__dict__}:
        raise JobDeclarationError(f"{where}: process() is not implemented")
    registry.add_job(cls)
    cls.__agent_job__ = True  # type: ignore[attr-defined]
    return cls


def _register_found(module: ModuleType) -> None:
    """Register the module's jobs again: it may have been imported before a registry reset."""
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, Job)
            and value.__module__ == module.__name__
            and getattr(value, "__agent_job__", False)
        ):
            registry.add_request(value.request_class)
            registry.add_job(value)


def init_jobs(packages: str | Iterable[str]) -> list[ModuleType]:
    """Import every `<package>/jobs/*.py` and `<package>/<module>/jobs/*.py`, so each `@agent_job`
    registers itself.

    `packages` is one package name or several. No central list: a new module with a `jobs/`
    folder is picked up by the next worker start. An import error propagates (a worker must not
    start with half its jobs), and so does finding no job module at all (ConfigurationError,
    naming where it looked).
    """
    roots = (packages,) if isinstance(packages, str) else tuple(packages)
    imported: list[ModuleType] = []
    for root_name in roots:
        root = importlib.import_module(root_name)
        modules = pkgutil.iter_modules(getattr(root, "__path__", []))
        candidates = [f"{root_name}.jobs"] + [f"{root_name}.{info.name}.jobs" for info in modules if info.ispkg]
        for jobs_pkg_name in candidates:
            imported += _import_jobs_package(jobs_pkg_name)
    if not imported:
        looked = ", ".join(f"{r}/jobs/*.py and {r}/<module>/jobs/*.py" for r in (p.replace(".", "/") for p in roots))
        raise ConfigurationError(f"init_jobs found no job module: looked for {looked or 'nothing (no package given)'}")
    logger.info("discovered %d job modules in %s", len(imported), ", ".join(roots))
    return imported


def _import_jobs_package(name: str) -> list[ModuleType]:
    try:
        jobs_pkg = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return []
        raise
    modules = []
    for job_module in pkgutil.iter_modules(getattr(jobs_pkg, "__path__", [])):
        module = importlib.import_module(f"{name}.{job_module.name}")
        _register_found(module)
        modules.append(module)
    return modules
