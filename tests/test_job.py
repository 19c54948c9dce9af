"""Job, JobResources, @agent_job and init_jobs: lazy resources, declaration refusals, registration, discovery."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ConfigurationError, Job, JobRequest, JobResources, agent_job, init_jobs
from agent_async.errors import JobDeclarationError
from agent_async.registry import JobRegistry


def unique(label: str) -> str:
    return f"test_job.{label}_{uuid.uuid4().hex[:8]}"


class Recorder:
    """A callable that records its calls and returns a fixed value."""

    def __init__(self, value: object) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.value


# -- JobResources ----------------------------------------------------------------------------------


def test_resources_expose_settings_and_namespace(settings: AgentSettings) -> None:
    resources = JobResources(settings, redis=Recorder(None), large_store=Recorder(None))
    assert resources.settings is settings
    assert resources.namespace == settings.namespace


def test_resources_reach_redis_and_the_store_lazily(settings: AgentSettings) -> None:
    fake_redis, fake_store = object(), object()
    redis, store = Recorder(fake_redis), Recorder(fake_store)

    resources = JobResources(settings, redis=redis, large_store=store)
    Job(resources)  # a Job built only for public_payload opens nothing either
    assert (redis.calls, store.calls) == (0, 0)

    assert resources.redis is fake_redis
    assert (redis.calls, store.calls) == (1, 0)
    assert resources.large_store() is fake_store
    assert (redis.calls, store.calls) == (1, 1)


def test_resources_ask_again_on_each_access(settings: AgentSettings) -> None:
    """Nothing is cached: a client rebound by the agent (after a reconnect) is what the job sees next."""
    clients = iter([object(), object()])
    resources = JobResources(settings, redis=lambda: next(clients), large_store=Recorder(None))
    assert resources.redis is not resources.redis


async def test_agent_resources_are_the_agents_redis(agent: Agent, redis: Redis) -> None:
    assert agent.resources.namespace == agent.settings.namespace
    assert isinstance(agent.resources.redis, Redis)
    await agent.resources.redis.set(f"{agent.resources.namespace}:probe", "1")
    assert await redis.get(f"{agent.resources.namespace}:probe") == b"1"


def test_an_unopened_agent_builds_its_resources_without_connecting(settings: AgentSettings) -> None:
    agent = Agent(settings)
    assert agent.resources.settings is settings
    assert agent.resources.namespace == settings.namespace


def test_job_defaults(settings: AgentSettings) -> None:
    resources = JobResources(settings, redis=Recorder(None), large_store=Recorder(None))
    job: Job[Any] = Job(resources)
    assert job.resources is resources
    assert job.public_payload({"a": 1, "secret": "s"}) == {"a": 1, "secret": "s"}


async def test_the_base_process_is_not_implemented(settings: AgentSettings) -> None:
    job: Job[Any] = Job(JobResources(settings, redis=Recorder(None), large_store=Recorder(None)))
    with pytest.raises(NotImplementedError):
        await job.process(JobRequest(), user_uid=None, job_id="j")


# -- @agent_job ------------------------------------------------------------------------------------


def test_a_job_without_request_class_is_refused(job_registry: JobRegistry) -> None:
    class NoRequest(Job[Any]):
        async def process(self, request: Any, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

    with pytest.raises(JobDeclarationError, match=r"test_job\..*NoRequest: request_class must be a JobRequest"):
        agent_job(NoRequest)


def test_a_request_class_that_is_no_job_request_is_refused(job_registry: JobRegistry) -> None:
    @dataclass
    class NotARequest:
        name: ClassVar[str] = unique("not_a_request")

    class Wrong(Job[Any]):
        request_class = NotARequest  # type: ignore[assignment]

        async def process(self, request: Any, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

    with pytest.raises(JobDeclarationError, match=r"Wrong: request_class must be a JobRequest subclass"):
        agent_job(Wrong)


def test_a_request_without_its_own_name_is_refused(job_registry: JobRegistry) -> None:
    @dataclass
    class Abstract(JobRequest):
        """No name: an abstract base, never registered."""

    class Nameless(Job[Abstract]):
        request_class = Abstract

        async def process(self, request: Abstract, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

    with pytest.raises(JobDeclarationError, match=r"test_job\..*Nameless: .*Abstract has no name of its own"):
        agent_job(Nameless)


def test_a_request_inheriting_its_name_is_refused(job_registry: JobRegistry) -> None:
    job_name = unique("parent")

    @dataclass
    class Parent(JobRequest):
        name: ClassVar[str] = job_name

    @dataclass
    class Child(Parent):
        """Inherits `name` from Parent: it has none of its own."""

    class ChildJob(Job[Child]):
        request_class = Child

        async def process(self, request: Child, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

    with pytest.raises(JobDeclarationError, match="Child has no name of its own"):
        agent_job(ChildJob)
    assert job_registry.job(job_name) is None


def test_a_job_without_process_is_refused(job_registry: JobRegistry) -> None:
    job_name = unique("no_process")

    @dataclass
    class Req(JobRequest):
        name: ClassVar[str] = job_name

    class Lazy(Job[Req]):
        request_class = Req

    with pytest.raises(JobDeclarationError, match=r"test_job\..*Lazy: process\(\) is not implemented"):
        agent_job(Lazy)
    assert job_registry.job(job_name) is None


def test_an_inherited_process_is_enough(job_registry: JobRegistry) -> None:
    job_name = unique("inherited")

    @dataclass
    class Req(JobRequest):
        name: ClassVar[str] = job_name

    class Base(Job[Req]):
        async def process(self, request: Req, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {"from": "base"}

    class Concrete(Base):
        request_class = Req

    assert agent_job(Concrete) is Concrete
    assert job_registry.job(job_name) is Concrete


def test_declaration_errors_are_type_errors() -> None:
    assert issubclass(JobDeclarationError, TypeError)


def test_a_registered_job_lives_only_in_its_registry_scope(job_registry: JobRegistry) -> None:
    job_name = unique("scoped")
    with job_registry.scoped():

        @dataclass
        class Req(JobRequest):
            name: ClassVar[str] = job_name
            text: str = ""

        @agent_job
        class Work(Job[Req]):
            request_class = Req

            async def process(self, request: Req, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
                return {"text": request.text}

        assert job_registry.job(job_name) is Work
        assert job_registry.request(job_name) is Req
        assert getattr(Work, "__agent_job__", False) is True
    assert job_registry.job(job_name) is None
    assert job_registry.request(job_name) is None


def test_two_jobs_for_one_request_are_refused(job_registry: JobRegistry) -> None:
    job_name = unique("twice")

    @dataclass
    class Req(JobRequest):
        name: ClassVar[str] = job_name

    @agent_job
    class First(Job[Req]):
        request_class = Req

        async def process(self, request: Req, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

    class Second(Job[Req]):
        request_class = Req

        async def process(self, request: Req, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

    with pytest.raises(JobDeclarationError, match="already registered"):
        agent_job(Second)
    assert job_registry.job(job_name) is First


# -- init_jobs -------------------------------------------------------------------------------------

JOB_SOURCE = """
from dataclasses import dataclass
from typing import ClassVar
from agent_async import Job, JobRequest, agent_job

@dataclass
class Req(JobRequest):
    name: ClassVar[str] = "{name}"

@agent_job
class Work(Job[Req]):
    request_class = Req
    async def process(self, request, *, user_uid, job_id):
        return {{}}
"""


@pytest.fixture
def package(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """`<pkg>/module/` on sys.path, forgotten (sys.path, sys.modules) after the test."""
    name = f"test_job_pkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    (root / "module").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "module" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    yield root, name
    sys.path.remove(str(tmp_path))
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def add_jobs(root: Path, module: str, files: dict[str, str]) -> None:
    jobs = root / "module" / module / "jobs"
    jobs.mkdir(parents=True)
    (root / "module" / module / "__init__.py").write_text("")
    (jobs / "__init__.py").write_text("")
    for filename, body in files.items():
        (jobs / filename).write_text(textwrap.dedent(body))


def test_init_jobs_accepts_one_package_name_as_a_string(
    package: tuple[Path, str], job_registry: JobRegistry
) -> None:
    root, pkg = package
    add_jobs(root, "billing", {"x.py": JOB_SOURCE.format(name=f"{pkg}.x")})

    modules = init_jobs(f"{pkg}.module")

    assert [m.__name__ for m in modules] == [f"{pkg}.module.billing.jobs.x"]
    assert job_registry.job(f"{pkg}.x") is not None
    assert job_registry.request(f"{pkg}.x") is not None


def test_init_jobs_accepts_any_iterable_of_names(package: tuple[Path, str], job_registry: JobRegistry) -> None:
    root, pkg = package
    add_jobs(root, "billing", {"x.py": JOB_SOURCE.format(name=f"{pkg}.gen")})
    modules = init_jobs(name for name in [f"{pkg}.module"])
    assert [m.__name__ for m in modules] == [f"{pkg}.module.billing.jobs.x"]
    assert job_registry.job(f"{pkg}.gen") is not None


def test_init_jobs_skips_modules_without_jobs_and_plain_files(
    package: tuple[Path, str], job_registry: JobRegistry
) -> None:
    root, pkg = package
    add_jobs(root, "billing", {"x.py": JOB_SOURCE.format(name=f"{pkg}.only")})
    (root / "module" / "nojobs").mkdir()
    (root / "module" / "nojobs" / "__init__.py").write_text("")
    (root / "module" / "helpers.py").write_text("raise RuntimeError('a plain module is never imported')\n")

    modules = init_jobs(f"{pkg}.module")

    assert [m.__name__ for m in modules] == [f"{pkg}.module.billing.jobs.x"]


def test_init_jobs_that_finds_no_job_module_says_where_it_looked(
    package: tuple[Path, str], job_registry: JobRegistry
) -> None:
    """A worker must not start with no jobs after a silent scan: the error names the layouts scanned."""
    _, pkg = package
    with pytest.raises(ConfigurationError, match=rf"{pkg}/module/jobs/\*\.py and {pkg}/module/<module>/jobs"):
        init_jobs(f"{pkg}.module")
    with pytest.raises(ConfigurationError, match="no package given"):
        init_jobs([])


def test_init_jobs_propagates_an_import_error_inside_a_jobs_package(
    package: tuple[Path, str], job_registry: JobRegistry
) -> None:
    root, pkg = package
    add_jobs(root, "billing", {"x.py": "import test_job_no_such_module_anywhere\n"})
    with pytest.raises(ModuleNotFoundError, match="test_job_no_such_module_anywhere"):
        init_jobs(f"{pkg}.module")
