"""JobRunner: one attempt of a Job run under its time limits and cancellation, reported as an Outcome.

The runner is driven directly (no worker, no queue): each test builds the Job with the agent's
resources, runs one attempt and asserts on the Outcome it returns.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest

from agent_async import (
    Agent,
    ConnectionCoolingDown,
    Job,
    JobRequest,
    JobStatus,
    SoftTimeLimitExceeded,
    agent_job,
    run_in_child,
)
from agent_async.lifecycle import Outcome
from agent_async.worker.child import RunHandle, current_run
from agent_async.worker.runner import Backoff, JobRunner, StopPolicy, retry_after_of
from tests.jobs import spin_forever

# Short grace periods: every stop in this module ends well within a second or two.
HARD_GRACE_S = 0.2
CANCEL_GRACE_S = 0.3
BACKOFF = Backoff(0.1, 0.15)


# -- jobs ------------------------------------------------------------------------------------------


@dataclass
class Typed(JobRequest):
    name: ClassVar[str] = "test_runner.typed"
    text: str = ""
    numbers: list[int] = field(default_factory=list)


@agent_job
class TypedJob(Job[Typed]):
    """Returns what it was given; remembers the request object it received."""

    request_class = Typed

    def __init__(self, resources: Any) -> None:
        super().__init__(resources)
        self.seen: list[Any] = []

    async def process(self, request: Typed, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        self.seen.append(request)
        return {"text": request.text, "sum": sum(request.numbers), "user": user_uid, "job_id": job_id}


@dataclass
class Returns(JobRequest):
    """Returns `what` picked from a table of good and bad results."""

    name: ClassVar[str] = "test_runner.returns"
    what: str = "none"


_RESULTS: dict[str, Any] = {
    "none": None,
    "empty": {},
    "list": [1, 2],
    "string": "done",
    "object": {"when": object()},
    "tuple": {"pair": (1, 2)},
    "nan": {"x": float("nan")},
    "int_key": {1: "one"},
}


@agent_job
class ReturnsJob(Job[Returns]):
    request_class = Returns

    async def process(self, request: Returns, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return _RESULTS[request.what]  # type: ignore[no-any-return]


@dataclass
class Raises(JobRequest):
    """Raises ValueError (retryable) or RuntimeError (not) with `message`."""

    name: ClassVar[str] = "test_runner.raises"
    max_try: ClassVar[int] = 3
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (ValueError,)
    kind: str = "runtime"
    message: str = "boom"


@agent_job
class RaisesJob(Job[Raises]):
    request_class = Raises

    async def process(self, request: Raises, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        if request.kind == "value":
            raise ValueError(request.message)
        if request.kind == "cancelled":
            raise asyncio.CancelledError()
        if request.kind == "retry_after":
            raise RetryAfterError(request.message, float(request.message))
        raise RuntimeError(request.message)


class RetryAfterError(ValueError):
    """A retryable failure that asks for a pause, as ConnectionCoolingDown or an HTTP 429 does."""

    def __init__(self, message: str, retry_after_s: object) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class Sleepy(JobRequest):
    """Sleeps cooperatively; records that it started and that it saw CancelledError."""

    name: ClassVar[str] = "test_runner.sleepy"
    soft_timeout_seconds: ClassVar[float] = 30
    sleep_s: float = 30.0


@agent_job
class SleepyJob(Job[Sleepy]):
    request_class = Sleepy

    def __init__(self, resources: Any) -> None:
        super().__init__(resources)
        self.started = asyncio.Event()
        self.cancel_messages: list[tuple[Any, ...]] = []
        self.cleaned_up = asyncio.Event()

    async def process(self, request: Sleepy, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        self.started.set()
        try:
            await asyncio.sleep(request.sleep_s)
        except asyncio.CancelledError as exc:
            self.cancel_messages.append(exc.args)
            raise
        finally:
            self.cleaned_up.set()
        return {"slept": request.sleep_s}


@dataclass
class SoftSleepy(Sleepy):
    """Sleepy with a soft time limit of 0.1 s."""

    name: ClassVar[str] = "test_runner.soft_sleepy"
    soft_timeout_seconds: ClassVar[float] = 0.1


@agent_job
class SoftSleepyJob(SleepyJob):
    request_class = SoftSleepy


@dataclass
class SleepyRetried(JobRequest):
    """Like Sleepy, but a soft time limit is retryable."""

    name: ClassVar[str] = "test_runner.sleepy_retried"
    soft_timeout_seconds: ClassVar[float] = 0.1
    max_try: ClassVar[int] = 2
    retry_for: ClassVar[tuple[type[BaseException], ...]] = (SoftTimeLimitExceeded,)


@agent_job
class SleepyRetriedJob(Job[SleepyRetried]):
    request_class = SleepyRetried

    async def process(self, request: SleepyRetried, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await asyncio.sleep(30)
        return {}


@dataclass
class Deaf(JobRequest):
    """Swallows every cancellation until the test releases it."""

    name: ClassVar[str] = "test_runner.deaf"
    soft_timeout_seconds: ClassVar[float] = 0.1


@agent_job
class DeafJob(Job[Deaf]):
    request_class = Deaf

    def __init__(self, resources: Any) -> None:
        super().__init__(resources)
        self.release = asyncio.Event()
        self.swallowed = 0
        self.task: asyncio.Task[Any] | None = None

    async def process(self, request: Deaf, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        self.task = asyncio.current_task()
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.swallowed += 1
        return {"released": True}


@dataclass
class PatientDeaf(JobRequest):
    """Deaf, with a soft time limit far away: only a cancel request stops it."""

    name: ClassVar[str] = "test_runner.patient_deaf"


@agent_job
class PatientDeafJob(DeafJob):
    request_class = PatientDeaf


@dataclass
class Stubborn(JobRequest):
    """Runs a child process that ignores SIGTERM (writes its pid to `marker_path`)."""

    name: ClassVar[str] = "test_runner.stubborn"
    marker_path: str = ""


@agent_job
class StubbornJob(Job[Stubborn]):
    request_class = Stubborn

    async def process(self, request: Stubborn, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await run_in_child(spin_forever, request.marker_path)
        return {}


@dataclass
class Required(JobRequest):
    name: ClassVar[str] = "test_runner.required"
    needed: str


@agent_job
class RequiredJob(Job[Required]):
    request_class = Required

    def __init__(self, resources: Any) -> None:
        super().__init__(resources)
        self.runs = 0

    async def process(self, request: Required, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        self.runs += 1
        return {}


@dataclass
class InContext(JobRequest):
    name: ClassVar[str] = "test_runner.in_context"


@agent_job
class InContextJob(Job[InContext]):
    """Reports whether the runner's context was entered around it, and which attempt handle it runs under."""

    request_class = InContext

    def __init__(self, resources: Any) -> None:
        super().__init__(resources)
        self.events: list[str] = []
        self.handle: RunHandle | None = None

    async def process(self, request: InContext, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        self.events.append("process")
        self.handle = current_run.get()
        return {}


# -- helpers ---------------------------------------------------------------------------------------


def make_runner(job: Job[Any], context: Any = None) -> JobRunner:
    return JobRunner(job, backoff=BACKOFF, stop=StopPolicy(HARD_GRACE_S, CANCEL_GRACE_S), context=context)


async def run_once(
    runner: JobRunner, payload: dict[str, Any], *, attempt: int = 1, handle: RunHandle | None = None
) -> Outcome:
    return await runner.run(payload, job_id="j1", user_uid="u", attempt=attempt, handle=handle or RunHandle("j1"))


async def wait_until(predicate: Any, *, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# -- success and results ---------------------------------------------------------------------------


async def test_success_returns_the_result_and_passes_a_typed_request(agent: Agent) -> None:
    job = TypedJob(agent.resources)
    outcome = await run_once(make_runner(job), {"text": "hi", "numbers": [1, 2, 3]})
    assert outcome == Outcome(JobStatus.SUCCESS, result={"text": "hi", "sum": 6, "user": "u", "job_id": "j1"})
    assert outcome.error is None and outcome.retry_in_s == 0.0
    [request] = job.seen
    assert type(request) is Typed
    assert request == Typed(text="hi", numbers=[1, 2, 3])


async def test_missing_payload_fields_take_their_defaults(agent: Agent) -> None:
    job = TypedJob(agent.resources)
    outcome = await run_once(make_runner(job), {})
    assert outcome.status is JobStatus.SUCCESS
    assert job.seen == [Typed()]


@pytest.mark.parametrize("what", ["none", "empty"])
async def test_none_or_empty_result_is_an_empty_dict(agent: Agent, what: str) -> None:
    outcome = await run_once(make_runner(ReturnsJob(agent.resources)), {"what": what})
    assert outcome.status is JobStatus.SUCCESS
    assert outcome.result == {}


@pytest.mark.parametrize(
    ("what", "detail"),
    [
        ("list", "result is a list, expected a dict"),
        ("string", "result is a str, expected a dict"),
        ("object", "result.when is a object, which is not JSON-safe"),
        ("tuple", "result.pair is a tuple"),
        ("nan", "result.x is nan"),
        ("int_key", "result has a non-string key 1"),
    ],
)
async def test_invalid_result_is_a_failure(agent: Agent, what: str, detail: str) -> None:
    outcome = await run_once(make_runner(ReturnsJob(agent.resources)), {"what": what})
    assert outcome.status is JobStatus.FAILURE
    assert outcome.result is None
    assert outcome.error is not None
    assert outcome.error.startswith("process() returned an invalid result: ")
    assert detail in outcome.error


# -- failures and retries --------------------------------------------------------------------------


async def test_exception_is_a_failure_named_by_its_type(agent: Agent) -> None:
    """Not in retry_for: FAILURE at once, even with attempts left."""
    outcome = await run_once(make_runner(RaisesJob(agent.resources)), {"kind": "runtime", "message": "boom"})
    assert outcome == Outcome(JobStatus.FAILURE, error="RuntimeError: boom")


async def test_exception_without_message_is_named_by_its_type_alone(agent: Agent) -> None:
    outcome = await run_once(make_runner(RaisesJob(agent.resources)), {"kind": "runtime", "message": ""})
    assert outcome == Outcome(JobStatus.FAILURE, error="RuntimeError")


async def test_process_cancelling_itself_is_a_failure(agent: Agent) -> None:
    """A CancelledError from inside process() (no stop was asked for) is a failure, not a cancel."""
    outcome = await run_once(make_runner(RaisesJob(agent.resources)), {"kind": "cancelled"})
    assert outcome.status is JobStatus.FAILURE
    assert outcome.error == "CancelledError: process() was cancelled"


@pytest.mark.parametrize("attempt", [1, 2])
async def test_retryable_exception_with_attempts_left_is_a_retry(agent: Agent, attempt: int) -> None:
    outcome = await run_once(
        make_runner(RaisesJob(agent.resources)), {"kind": "value", "message": "flaky"}, attempt=attempt
    )
    assert outcome.status is JobStatus.RETRY
    assert outcome.error == "ValueError: flaky"
    ceiling = min(BACKOFF.max_s, BACKOFF.base_s * 2 ** (attempt - 1))
    assert 0.5 * ceiling <= outcome.retry_in_s <= ceiling


@pytest.mark.parametrize(("asked_s", "least_s"), [("0.12", 0.12), ("99", BACKOFF.max_s), ("0", 0.0)])
async def test_a_retry_waits_at_least_what_the_failure_asks_capped_by_the_max(
    agent: Agent, asked_s: str, least_s: float
) -> None:
    outcome = await run_once(make_runner(RaisesJob(agent.resources)), {"kind": "retry_after", "message": asked_s})
    assert outcome.status is JobStatus.RETRY
    assert least_s <= outcome.retry_in_s <= max(least_s, BACKOFF.base_s)


@pytest.mark.parametrize("value", [None, "soon", -1.0, math.inf, math.nan, True])
def test_a_retry_after_that_is_no_duration_is_ignored(value: object) -> None:
    assert retry_after_of(RetryAfterError("x", value)) == 0.0
    assert retry_after_of(RetryAfterError("x", 2)) == 2.0
    assert retry_after_of(ConnectionCoolingDown("ics:h", 12.5)) == 12.5


async def test_retryable_exception_at_max_try_gives_up(agent: Agent) -> None:
    outcome = await run_once(
        make_runner(RaisesJob(agent.resources)), {"kind": "value", "message": "flaky"}, attempt=Raises.max_try
    )
    assert outcome.status is JobStatus.FAILURE
    assert outcome.error == f"ValueError: flaky (gave up after {Raises.max_try} attempts)"
    assert outcome.retry_in_s == 0.0


async def test_payload_that_does_not_fit_fails_without_running(agent: Agent) -> None:
    job = TypedJob(agent.resources)
    outcome = await run_once(make_runner(job), {"text": "hi", "bogus": 1})
    assert outcome.status is JobStatus.FAILURE
    assert outcome.error is not None
    assert outcome.error.startswith("the payload does not fit Typed: ")
    assert "bogus" in outcome.error
    assert job.seen == [], "process() never ran"


async def test_payload_missing_a_required_field_fails_without_running(agent: Agent) -> None:
    """A payload the dataclass itself refuses (a required field missing) is the same refusal."""
    job = RequiredJob(agent.resources)
    outcome = await run_once(make_runner(job), {})
    assert outcome.status is JobStatus.FAILURE
    assert outcome.error is not None and outcome.error.startswith("the payload does not fit Required: ")
    assert "needed" in outcome.error
    assert job.runs == 0
    assert (await run_once(make_runner(job), {"needed": "x"})).status is JobStatus.SUCCESS


# -- time limits -----------------------------------------------------------------------------------


async def test_soft_time_limit_cancels_process_and_fails(agent: Agent) -> None:
    job = SoftSleepyJob(agent.resources)
    t0 = time.monotonic()
    outcome = await run_once(make_runner(job), {"sleep_s": 30.0})
    elapsed_s = time.monotonic() - t0
    assert outcome.status is JobStatus.FAILURE
    assert outcome.error == "SoftTimeLimitExceeded: soft time limit of 0.1s exceeded"
    assert job.cancel_messages == [("soft time limit of 0.1s exceeded",)], "process() saw a CancelledError naming it"
    assert job.cleaned_up.is_set()
    assert SoftSleepy.soft_timeout_seconds <= elapsed_s < SoftSleepy.soft_timeout_seconds + HARD_GRACE_S


async def test_job_finishing_before_its_soft_limit_is_not_stopped(agent: Agent) -> None:
    job = SoftSleepyJob(agent.resources)
    outcome = await run_once(make_runner(job), {"sleep_s": 0.01})
    assert outcome == Outcome(JobStatus.SUCCESS, result={"slept": 0.01})
    assert job.cancel_messages == []


async def test_soft_time_limit_listed_in_retry_for_is_retried(agent: Agent) -> None:
    outcome = await run_once(make_runner(SleepyRetriedJob(agent.resources)), {}, attempt=1)
    assert outcome.status is JobStatus.RETRY
    assert outcome.error == "SoftTimeLimitExceeded: soft time limit of 0.1s exceeded"
    assert 0.5 * BACKOFF.base_s <= outcome.retry_in_s <= BACKOFF.base_s
    last = await run_once(make_runner(SleepyRetriedJob(agent.resources)), {}, attempt=SleepyRetried.max_try)
    assert last.status is JobStatus.FAILURE
    assert last.error == "SoftTimeLimitExceeded: soft time limit of 0.1s exceeded (gave up after 2 attempts)"


async def test_job_swallowing_cancellation_is_abandoned_at_the_hard_limit(agent: Agent) -> None:
    """Phase 1 is ignored and there is no child to kill: the task is abandoned (the runner returns)."""
    job = DeafJob(agent.resources)
    t0 = time.monotonic()
    outcome = await run_once(make_runner(job), {})
    elapsed_s = time.monotonic() - t0
    assert outcome.status is JobStatus.FAILURE
    hard_s = Deaf.soft_timeout_seconds + HARD_GRACE_S
    assert outcome.error == (
        f"HardTimeLimitExceeded: hard time limit of {hard_s:g}s exceeded "
        f"(abandoned after {HARD_GRACE_S:g}s: the job ignores cancellation)"
    )
    assert job.swallowed >= 1, "phase 1 did cancel the task"
    # Soft limit + grace + the runner's last wait after phase 2 (1 s), and not much more.
    assert hard_s <= elapsed_s < hard_s + 2.0
    # The abandoned task is still running; let it end so it does not outlive the test.
    assert job.task is not None and not job.task.done()
    job.release.set()
    assert await asyncio.wait_for(job.task, timeout=2) == {"released": True}


# -- cancellation ----------------------------------------------------------------------------------


async def test_cancel_request_while_running_stops_cooperatively(agent: Agent) -> None:
    job = SleepyJob(agent.resources)
    handle = RunHandle("j1")
    attempt = asyncio.create_task(run_once(make_runner(job), {"sleep_s": 30.0}, handle=handle))
    await asyncio.wait_for(job.started.wait(), timeout=5)
    t0 = time.monotonic()
    handle.request_cancel()
    outcome = await asyncio.wait_for(attempt, timeout=5)
    assert outcome == Outcome(JobStatus.CANCELED, error="canceled while running (stopped cooperatively)")
    assert job.cancel_messages == [("cancel requested",)]
    assert job.cleaned_up.is_set()
    assert time.monotonic() - t0 < CANCEL_GRACE_S, "a cooperative job is not held for the grace"


async def test_cancel_requested_before_the_run_is_canceled(agent: Agent) -> None:
    handle = RunHandle("j1")
    handle.request_cancel()
    outcome = await run_once(make_runner(SleepyJob(agent.resources)), {"sleep_s": 30.0}, handle=handle)
    assert outcome.status is JobStatus.CANCELED
    assert outcome.error is not None and outcome.error.startswith("canceled while running")


async def test_cancel_of_a_job_ignoring_it_is_abandoned_after_the_cancel_grace(agent: Agent) -> None:
    job = PatientDeafJob(agent.resources)
    handle = RunHandle("j1")
    attempt = asyncio.create_task(run_once(make_runner(job), {}, handle=handle))
    await wait_until(lambda: job.task is not None)
    handle.request_cancel()
    outcome = await asyncio.wait_for(attempt, timeout=5)
    assert outcome == Outcome(
        JobStatus.CANCELED,
        error=f"canceled while running (abandoned after {CANCEL_GRACE_S:g}s: the job ignores cancellation)",
    )
    assert job.task is not None
    job.release.set()
    await asyncio.wait_for(job.task, timeout=2)


@pytest.mark.slow
async def test_cancel_kills_a_child_that_ignores_sigterm(agent: Agent, tmp_path: Path) -> None:
    """Phase 2: after the cancel grace the attempt's child processes are SIGKILLed."""
    marker = tmp_path / "child.pid"
    handle = RunHandle("j1")
    attempt = asyncio.create_task(
        run_once(make_runner(StubbornJob(agent.resources)), {"marker_path": str(marker)}, handle=handle)
    )
    await wait_until(lambda: marker.exists() and marker.read_text() != "")
    child = psutil.Process(int(marker.read_text()))
    assert child.is_running()
    handle.request_cancel()
    outcome = await asyncio.wait_for(attempt, timeout=10)
    assert outcome == Outcome(
        JobStatus.CANCELED,
        error=f"canceled while running (stopped hard after {CANCEL_GRACE_S:g}s: 1 child process(es) killed)",
    )
    _, alive = psutil.wait_procs([child], timeout=5)
    assert alive == []
    assert handle.live_children() == []


async def test_worker_shutdown_cancels_the_attempt(agent: Agent) -> None:
    """Cancelling run() itself (the worker stopping) propagates and takes the attempt down."""
    job = SleepyJob(agent.resources)
    attempt = asyncio.create_task(run_once(make_runner(job), {"sleep_s": 30.0}))
    await asyncio.wait_for(job.started.wait(), timeout=5)
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    await asyncio.wait_for(job.cleaned_up.wait(), timeout=2)
    assert len(job.cancel_messages) == 1


# -- context ---------------------------------------------------------------------------------------


async def test_context_wraps_process_and_the_handle_is_current(agent: Agent) -> None:
    job = InContextJob(agent.resources)

    @asynccontextmanager
    async def context() -> AsyncIterator[None]:
        job.events.append("enter")
        try:
            yield
        finally:
            job.events.append("exit")

    handle = RunHandle("j1")
    outcome = await run_once(make_runner(job, context=context), {}, handle=handle)
    assert outcome.status is JobStatus.SUCCESS
    assert job.events == ["enter", "process", "exit"]
    assert job.handle is handle, "run_in_child inside process() finds the attempt's handle"
    assert current_run.get() is None, "the handle does not leak into the caller's context"


async def test_context_failing_to_enter_is_a_failure(agent: Agent) -> None:
    job = InContextJob(agent.resources)

    @asynccontextmanager
    async def context() -> AsyncIterator[None]:
        raise ConnectionError("database down")
        yield  # pragma: no cover

    outcome = await run_once(make_runner(job, context=context), {})
    assert outcome == Outcome(JobStatus.FAILURE, error="ConnectionError: database down")
    assert job.events == []


# -- Backoff ---------------------------------------------------------------------------------------


def test_backoff_is_exponential_capped_and_jittered() -> None:
    backoff = Backoff(base_s=0.1, max_s=1.0)
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    rng = random.Random(42)
    for attempt, ceiling in enumerate(ceilings, start=1):
        for _ in range(50):
            delay = backoff.delay_s(attempt, rng)
            assert 0.5 * ceiling <= delay <= ceiling, (attempt, delay)


def test_backoff_jitter_is_a_factor_of_the_ceiling_drawn_from_the_rng() -> None:
    backoff = Backoff(base_s=0.5, max_s=3.0)
    expected_rng = random.Random(7)
    rng = random.Random(7)
    for attempt in range(1, 8):
        ceiling = min(3.0, 0.5 * 2 ** (attempt - 1))
        assert backoff.delay_s(attempt, rng) == pytest.approx(ceiling * expected_rng.uniform(0.5, 1.0))


def test_backoff_jitter_spans_half_to_full_ceiling() -> None:
    backoff = Backoff(base_s=1.0, max_s=1.0)
    rng = random.Random(3)
    delays = [backoff.delay_s(1, rng) for _ in range(2000)]
    assert min(delays) < 0.52 and max(delays) > 0.98


def test_backoff_of_attempt_zero_uses_the_base() -> None:
    backoff = Backoff(base_s=0.2, max_s=10.0)
    rng = random.Random(1)
    assert all(0.1 <= backoff.delay_s(attempt, rng) <= 0.2 for attempt in (0, -3, 1))


def test_backoff_honours_a_floor_capped_at_the_max() -> None:
    backoff = Backoff(base_s=0.1, max_s=2.0)
    rng = random.Random(5)
    assert all(1.5 <= backoff.delay_s(1, rng, at_least_s=1.5) <= 1.5 for _ in range(20))
    assert backoff.delay_s(1, rng, at_least_s=60.0) == 2.0
    assert 0.05 <= backoff.delay_s(1, rng, at_least_s=0.0) <= 0.1


def test_backoff_without_rng_stays_in_bounds() -> None:
    backoff = Backoff(base_s=0.1, max_s=0.3)
    assert all(0.15 <= backoff.delay_s(5) <= 0.3 for _ in range(100))
