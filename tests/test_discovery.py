"""init_jobs: discovery of <package>/<module>/jobs/*.py with no central list."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_async import init_jobs
from agent_async.registry import JobRegistry


@pytest.fixture
def package_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    name = f"discover_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    (root / "module").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "module" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    yield root, name
    sys.path.remove(str(tmp_path))
    for mod in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[mod]


def add_module(root: Path, module: str, files: dict[str, str]) -> None:
    jobs = root / "module" / module / "jobs"
    jobs.mkdir(parents=True)
    (root / "module" / module / "__init__.py").write_text("")
    (jobs / "__init__.py").write_text("")
    for filename, body in files.items():
        (jobs / filename).write_text(textwrap.dedent(body))


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


def test_discovers_every_module_jobs_folder(package_root: tuple[Path, str], job_registry: JobRegistry) -> None:
    root, pkg = package_root
    add_module(root, "billing", {"invoice.py": JOB_SOURCE.format(name=f"{pkg}.invoice")})
    add_module(
        root,
        "calendar",
        {"export.py": JOB_SOURCE.format(name=f"{pkg}.export"), "sync.py": JOB_SOURCE.format(name=f"{pkg}.sync")},
    )
    (root / "module" / "nojobs").mkdir()
    (root / "module" / "nojobs" / "__init__.py").write_text("")

    modules = init_jobs([f"{pkg}.module"])

    assert sorted(m.__name__.rsplit(".", 1)[1] for m in modules) == ["export", "invoice", "sync"]
    assert {f"{pkg}.invoice", f"{pkg}.export", f"{pkg}.sync"} <= set(job_registry.jobs())


def test_broken_job_module_stops_discovery(package_root: tuple[Path, str], job_registry: JobRegistry) -> None:
    """A worker must not start with half its jobs: an import error propagates."""
    root, pkg = package_root
    add_module(root, "broken", {"bad.py": "import does_not_exist_anywhere\n"})
    with pytest.raises(ModuleNotFoundError, match="does_not_exist_anywhere"):
        init_jobs([f"{pkg}.module"])


def test_unknown_package_is_an_error(job_registry: JobRegistry) -> None:
    with pytest.raises(ModuleNotFoundError):
        init_jobs(["no_such_package_here.module"])


def test_rediscovery_registers_again_after_a_registry_reset(
    package_root: tuple[Path, str], job_registry: JobRegistry
) -> None:
    """A module imported before a registry reset (tests, app factories) is registered again by the
    next init_jobs, although Python does not import it twice."""
    root, pkg = package_root
    add_module(root, "billing", {"invoice.py": JOB_SOURCE.format(name=f"{pkg}.again")})
    with job_registry.scoped():
        init_jobs([f"{pkg}.module"])
        assert job_registry.job(f"{pkg}.again") is not None
    assert job_registry.job(f"{pkg}.again") is None
    init_jobs([f"{pkg}.module"])
    assert job_registry.job(f"{pkg}.again") is not None
    assert job_registry.request(f"{pkg}.again") is not None
