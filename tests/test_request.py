"""JobRequest and Job declarations: registration, payload round trip, errors at import naming the class."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import pytest

from agent_async import ERROR_JOB_PAYLOAD_INVALID, Job, JobDeclarationError, JobRequest, RequestException, agent_job
from agent_async.registry import JobRegistry


def test_request_registers_under_its_name(job_registry: JobRegistry) -> None:
    @dataclass
    class Fresh(JobRequest):
        name: ClassVar[str] = "decl.fresh"
        n: int = 0

    assert job_registry.request("decl.fresh") is Fresh


def test_abstract_base_without_name_is_not_registered(job_registry: JobRegistry) -> None:
    before = job_registry.requests()

    @dataclass
    class Base(JobRequest):
        soft_timeout_seconds: ClassVar[float] = 5

    assert job_registry.requests() == before


def test_payload_round_trip(job_registry: JobRegistry) -> None:
    @dataclass
    class Rich(JobRequest):
        name: ClassVar[str] = "decl.rich"
        title: str = ""
        tags: list[str] = field(default_factory=list)
        meta: dict[str, Any] = field(default_factory=dict)
        limit: int | None = None
        ratio: float = 0.5
        flag: bool = False

    original = Rich(title="t", tags=["a"], meta={"k": [1, {"x": None}]}, limit=3)
    payload = original.payload()
    assert payload == {
        "title": "t",
        "tags": ["a"],
        "meta": {"k": [1, {"x": None}]},
        "limit": 3,
        "ratio": 0.5,
        "flag": False,
    }
    assert Rich.from_payload(payload) == original
    assert Rich.from_payload({}) == Rich()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('name: ClassVar[str] = "decl.dup"', "already used by"),
        ('name: ClassVar[str] = "decl.bad_try"\n    max_try: ClassVar[int] = 0', "max_try must be an int >= 1"),
        ('name: ClassVar[str] = "decl.bad_cron"\n    cron: ClassVar[str] = "61 * * * *"', "not a valid 5-field cron"),
        ('name: ClassVar[str] = "decl.six"\n    cron: ClassVar[str] = "0 0 * * * *"', "not a valid 5-field cron"),
        ('name: ClassVar[str] = "decl.type"\n    when: datetime = None', "payload field 'when'"),
        ('name: ClassVar[str] = "decl.tuple"\n    pair: tuple[int, int] = (1, 2)', "payload field 'pair'"),
        ('name: ClassVar[str] = "decl.retry"\n    retry_for: ClassVar[tuple] = ("x",)', "retry_for must be"),
        ('name: ClassVar[str] = "decl.gate"\n    max_concurrent: ClassVar[int] = -1', "max_concurrent"),
        ('name: ClassVar[str] = "has space"', "without spaces"),
    ],
)
def test_misdeclared_request_fails_at_import_naming_the_class(
    job_registry: JobRegistry, body: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    @dataclass
    class Original(JobRequest):
        name: ClassVar[str] = "decl.dup"

    source = f"@dataclass\nclass Culprit(JobRequest):\n    {body}\n"
    module = types.ModuleType("decl_module")
    module.__dict__.update(dataclass=dataclass, ClassVar=ClassVar, JobRequest=JobRequest, datetime=datetime)
    monkeypatch.setitem(sys.modules, "decl_module", module)
    with pytest.raises(JobDeclarationError) as caught:
        exec(compile(source, "decl_module.py", "exec"), module.__dict__)
    assert "decl_module.Culprit" in str(caught.value)
    assert message in str(caught.value)


def test_from_payload_refuses_unknown_and_mistyped_input(job_registry: JobRegistry) -> None:
    @dataclass
    class Strict(JobRequest):
        name: ClassVar[str] = "decl.strict"
        a: int = 0

    with pytest.raises(RequestException) as caught:
        Strict.from_payload({"a": 1, "b": 2})
    assert caught.value.code == ERROR_JOB_PAYLOAD_INVALID and "['b']" in caught.value.message


def test_job_needs_a_request_and_a_process(job_registry: JobRegistry) -> None:
    @dataclass
    class Req(JobRequest):
        name: ClassVar[str] = "decl.job"

    with pytest.raises(JobDeclarationError, match="request_class must be a JobRequest subclass"):

        @agent_job
        class NoRequest(Job):  # type: ignore[misc]
            pass

    with pytest.raises(JobDeclarationError, match="process"):

        @agent_job
        class NoProcess(Job[Req]):
            request_class = Req

    @agent_job
    class Good(Job[Req]):
        request_class = Req

        async def process(self, request: Req, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

    assert job_registry.job("decl.job") is Good
    assert Good(None).public_payload({"x": 1}) == {"x": 1}  # type: ignore[arg-type]

    with pytest.raises(JobDeclarationError, match="already registered"):

        @agent_job
        class Second(Good):
            pass
