"""JobStateSerializerDict: the public view of a JobState decides itself what is shown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agent_async import Agent, AgentSettings, Job, JobRequest, JobState, JobStatus, agent_job
from agent_async.registry import JobRegistry
from agent_async.serializer import JobStateSerializerDict, Serializer, public_progress, public_result


def declare_jobs() -> None:
    @dataclass
    class Secretive(JobRequest):
        name: ClassVar[str] = "tests.serializer.secretive"
        calendar_key: str = ""
        source_ref: str = ""
        token: str = ""

    @agent_job
    class SecretiveJob(Job[Secretive]):
        request_class = Secretive

        async def process(self, request: Secretive, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

        def public_payload(self, payload: dict[str, Any]) -> dict[str, Any]:
            payload.pop("token")  # mutates its argument: the serializer must hand it a copy
            return {k: v for k, v in payload.items() if k != "source_ref"}

    @dataclass
    class Plain(JobRequest):
        name: ClassVar[str] = "tests.serializer.plain"
        text: str = ""

    @agent_job
    class PlainJob(Job[Plain]):
        request_class = Plain

        async def process(self, request: Plain, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

    @dataclass
    class Broken(JobRequest):
        name: ClassVar[str] = "tests.serializer.broken"

    @agent_job
    class BrokenJob(Job[Broken]):
        request_class = Broken

        async def process(self, request: Broken, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

        def public_payload(self, payload: dict[str, Any]) -> dict[str, Any]:
            raise KeyError("boom")


def state(name: str, payload: dict[str, Any], result: dict[str, Any] | None = None) -> JobState:
    return JobState(
        job_id="job-123", name=name, user_uid="alice", status=JobStatus.SUCCESS, payload=payload,
        result=result, error=None, attempts=2, schedule_name="nightly", created_ms=1, started_ms=2, finished_ms=3,
    )


def serializer(job_registry: JobRegistry) -> JobStateSerializerDict:
    declare_jobs()
    agent = Agent(AgentSettings())
    return JobStateSerializerDict(job_registry, resources=agent.resources)


def test_only_owner_facing_fields(job_registry: JobRegistry) -> None:
    """The view has exactly status, payload, result, error and progress: no id, name, user, attempts, schedule
    or dates."""
    view = serializer(job_registry).dump(state("tests.serializer.plain", {"text": "hi"}, {"n": 1}))
    assert view == {"status": "SUCCESS", "payload": {"text": "hi"}, "result": {"n": 1}, "error": None, "progress": None}


def test_progress_is_shown_with_an_iso_time(job_registry: JobRegistry) -> None:
    """The last report_progress(): fraction, message, the job's own details (like its result), ISO time."""
    job_state = state("tests.serializer.plain", {})
    job_state.progress = {"fraction": 0.4, "message": "page 4", "details": {"pages": 4}, "updated_ms": 1700000000250}
    view = serializer(job_registry).dump(job_state)
    assert view["progress"] == {
        "fraction": 0.4, "message": "page 4", "details": {"pages": 4}, "updated_at": "2023-11-14T22:13:20.250000+00:00",
    }
    assert public_progress({"fraction": 1, "message": None, "details": {}, "updated_ms": 0}) == {
        "fraction": 1.0, "message": None, "details": {}, "updated_at": "1970-01-01T00:00:00+00:00",
    }
    assert public_progress(None) is None
    assert public_progress({"fraction": "x", "updated_ms": 1}) is None  # unreadable: withheld, never a 500


def test_payload_goes_through_public_payload_on_a_copy(job_registry: JobRegistry) -> None:
    """The Job's public_payload redacts the payload; the stored state keeps the full payload."""
    original = {"calendar_key": "k", "source_ref": "agent:file:" + "0" * 32, "token": "s3cr3t"}
    job_state = state("tests.serializer.secretive", dict(original))
    view = serializer(job_registry).dump(job_state)
    assert view["payload"] == {"calendar_key": "k"}
    assert job_state.payload == original


def test_large_result_is_dropped(job_registry: JobRegistry) -> None:
    """large_result is an internal locator: removed from the view, other result keys kept."""
    ref = "agent:file:" + "a" * 32
    view = serializer(job_registry).dump(
        state("tests.serializer.plain", {}, {"large_result": ref, "filename": "a.ics", "events": 3})
    )
    assert view["result"] == {"filename": "a.ics", "events": 3}
    assert public_result(None) is None


def test_unknown_job_or_failing_redaction_withholds_the_payload(job_registry: JobRegistry) -> None:
    """Fail closed: no Job registered for the name, or public_payload raising, shows payload None."""
    s = serializer(job_registry)
    assert s.dump(state("tests.serializer.nobody", {"token": "x"}))["payload"] is None
    assert s.dump(state("tests.serializer.broken", {"a": 1}))["payload"] is None


def test_is_a_serializer() -> None:
    """JobStateSerializerDict implements the shared Serializer base."""
    assert issubclass(JobStateSerializerDict, Serializer)
