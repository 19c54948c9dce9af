"""agent_async.lifecycle: statuses, the terminal set, the resume rule, outcomes, error kinds, and
the Lua scripts applying the same rules as the Python."""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass
from importlib import resources
from typing import ClassVar

import pytest
from redis.asyncio import Redis

from agent_async import ACTIVE, TERMINAL, Agent, AgentSettings, ClientAgent, ErrorKind, JobRequest, JobStatus
from agent_async.lifecycle import (
    attempt_budget_s,
    dropped_outcome,
    interrupted_outcome,
    lua_constants,
    may_resume,
    now_ms,
)
from agent_async.store import CancelReply
from agent_async.store.scripts import metrics_constants
from agent_async.worker import JobRecovery


@dataclass
class Resuming(JobRequest):
    name: ClassVar[str] = "test_lifecycle_rules.resuming"
    resume: ClassVar[bool] = True
    max_try: ClassVar[int] = 2


@dataclass
class NotResuming(JobRequest):
    name: ClassVar[str] = "test_lifecycle_rules.not_resuming"
    max_try: ClassVar[int] = 3


@dataclass
class Quick(JobRequest):
    name: ClassVar[str] = "test_lifecycle_rules.quick"
    soft_timeout_seconds: ClassVar[float] = 1.5


# -- statuses --------------------------------------------------------------------------------------


def test_terminal_and_active_partition_the_statuses() -> None:
    assert {JobStatus.SUCCESS, JobStatus.FAILURE, JobStatus.CANCELED} == TERMINAL
    assert {JobStatus.PENDING, JobStatus.STARTED, JobStatus.RETRY} == ACTIVE
    assert set(JobStatus) == TERMINAL | ACTIVE
    assert not TERMINAL & ACTIVE


def test_statuses_are_their_names() -> None:
    """The values are what Redis stores and the API shows: they must not drift from the names."""
    assert [s.value for s in JobStatus] == [s.name for s in JobStatus]
    assert JobStatus("SUCCESS") is JobStatus.SUCCESS


# -- the resume rule -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resume", "attempts", "max_try", "expected"),
    [
        (True, 0, 1, True),
        (True, 1, 1, False),
        (True, 1, 2, True),
        (True, 2, 2, False),
        (True, 3, 2, False),
        (True, 2, 5, True),
        (False, 0, 1, False),
        (False, 1, 3, False),
        (False, 3, 3, False),
    ],
)
def test_may_resume(resume: bool, attempts: int, max_try: int, expected: bool) -> None:
    assert may_resume(resume=resume, attempts=attempts, max_try=max_try) is expected


# -- outcomes --------------------------------------------------------------------------------------


def test_interrupted_with_attempts_left_is_queued_again() -> None:
    outcome = interrupted_outcome(Resuming, attempts=1)
    assert outcome.status is JobStatus.PENDING
    assert outcome.error == "interrupted by worker shutdown; queued again"
    assert outcome.result is None and outcome.retry_in_s == 0.0


def test_interrupted_out_of_attempts_fails() -> None:
    outcome = interrupted_outcome(Resuming, attempts=Resuming.max_try)
    assert outcome.status is JobStatus.FAILURE
    assert outcome.error == "WorkerShutdown: interrupted by worker shutdown (no attempts left)"


@pytest.mark.parametrize("attempts", [0, 1, 2])
def test_interrupted_without_resume_fails(attempts: int) -> None:
    outcome = interrupted_outcome(NotResuming, attempts=attempts)
    assert outcome.status is JobStatus.FAILURE
    assert outcome.error == "WorkerShutdown: interrupted by worker shutdown (resume is off)"


def test_interrupted_job_of_unknown_class_fails() -> None:
    """No request class (the worker does not know the job): it cannot be resumed."""
    outcome = interrupted_outcome(None, attempts=0)
    assert outcome.status is JobStatus.FAILURE
    assert outcome.error == "WorkerShutdown: interrupted by worker shutdown (resume is off)"


@pytest.mark.parametrize(
    ("resume", "attempts", "max_try"), list(itertools.product([True, False], range(4), range(1, 4)))
)
def test_interrupted_outcome_follows_may_resume(resume: bool, attempts: int, max_try: int) -> None:
    # An unnamed subclass is an abstract base: it is not registered anywhere.
    request_class = type("Grid", (JobRequest,), {"resume": resume, "max_try": max_try})
    outcome = interrupted_outcome(request_class, attempts=attempts)
    expected = JobStatus.PENDING if may_resume(resume=resume, attempts=attempts, max_try=max_try) else JobStatus.FAILURE
    assert outcome.status is expected


def test_dropped_outcome() -> None:
    failed = dropped_outcome("function 'x' not found")
    assert failed.status is JobStatus.FAILURE
    assert failed.error == "dropped by the queue engine: function 'x' not found"
    canceled = dropped_outcome("aborted", canceled=True)
    assert canceled.status is JobStatus.CANCELED
    assert canceled.error == "dropped by the queue engine: aborted"


@pytest.mark.parametrize("reason", [None, ""])
def test_dropped_outcome_without_reason_says_the_job_disappeared(reason: str | None) -> None:
    outcome = dropped_outcome(reason)
    assert outcome.status is JobStatus.FAILURE
    assert outcome.error == "dropped by the queue engine: its queued job disappeared (expired or deleted)"


# -- error kinds, budgets, clock -------------------------------------------------------------------


def test_error_kinds_describe_with_their_prefix() -> None:
    assert {k.value for k in ErrorKind} == {
        "WorkerLost",
        "WorkerShutdown",
        "SoftTimeLimitExceeded",
        "HardTimeLimitExceeded",
        "AccessRevoked",
    }
    assert ErrorKind.WORKER_LOST.describe("gone") == "WorkerLost: gone"
    assert ErrorKind.HARD_TIME_LIMIT.describe("") == "HardTimeLimitExceeded: "
    for kind in ErrorKind:
        assert kind.describe("x").startswith(f"{kind.value}: ")


def test_soft_time_limit_kind_is_the_exception_name() -> None:
    """A soft-limit error reads `SoftTimeLimitExceeded: ...` because the runner formats the
    exception by its type name: the kind and the class name must agree."""
    from agent_async import SoftTimeLimitExceeded

    assert ErrorKind.SOFT_TIME_LIMIT.value == SoftTimeLimitExceeded.__name__


def test_attempt_budget_covers_the_soft_limit_the_longer_grace_and_a_margin() -> None:
    settings = AgentSettings(namespace="t-budget", hard_timeout_grace_s=0.5, cancel_grace_s=3.0)
    assert attempt_budget_s(Quick, settings) == pytest.approx(1.5 + 3.0 + 2.0)
    settings = AgentSettings(namespace="t-budget", hard_timeout_grace_s=4.0, cancel_grace_s=1.0)
    assert attempt_budget_s(Quick, settings) == pytest.approx(1.5 + 4.0 + 2.0)


def test_now_ms_is_epoch_milliseconds() -> None:
    before = int(time.time() * 1000)
    value = now_ms()
    after = int(time.time() * 1000)
    assert isinstance(value, int)
    assert before - 1 <= value <= after + 1


# -- the Lua side ----------------------------------------------------------------------------------


def test_lua_constants_match_the_python_rules() -> None:
    constants = lua_constants()
    entries = constants["@TERMINAL_SET@"].split(",")
    assert {entry.removeprefix("['").removesuffix("']=true") for entry in entries} == {s.value for s in TERMINAL}
    assert constants["@WORKER_LOST@"] == ErrorKind.WORKER_LOST.value


def test_every_lifecycle_placeholder_in_the_store_scripts_is_provided() -> None:
    """The store's Lua names no status or error kind of its own: the placeholders it uses are
    exactly what lua_constants() fills in (plus the store's own batch size, event stream and metrics)."""
    used: set[str] = set()
    for entry in resources.files("agent_async.store").joinpath("lua").iterdir():
        if entry.name.endswith(".lua"):
            code = "\n".join(line.split("--", 1)[0] for line in entry.read_text().splitlines())
            used |= set(re.findall(r"@[A-Z_]+@", code))
    store_own = {
        "@PRUNE_BATCH@", "@PRUNE_EVERY@", "@EVENTS@", "@EVENTS_KEPT@", "@EVENTS_PER_ENTRY@", *metrics_constants(""),
    }
    assert used - store_own == set(lua_constants())


# (resume, attempts, max_try) of a run lost by its worker; attempts >= 1 since it started.
LOST_GRID = list(itertools.product([True, False], [1, 2, 3], [1, 2, 3]))


async def lost_run(
    agent: Agent, client: ClientAgent, redis: Redis, *, resume: bool, attempts: int, max_try: int
) -> str:
    """A STARTED job whose lease ran out, with these resume fields on its state."""
    job_id = await client.enqueue(NotResuming())
    assert (await agent.job_store.start(job_id)).run
    await redis.hset(
        agent.keys.state(job_id),
        mapping={"attempts": str(attempts), "max_try": str(max_try), "resume": "1" if resume else "0"},
    )
    await redis.zadd(agent.keys.leases, {job_id: now_ms() - 10_000})
    return job_id


@pytest.mark.parametrize(("resume", "attempts", "max_try"), LOST_GRID)
async def test_lua_resume_rule_agrees_with_may_resume(
    agent: Agent, client: ClientAgent, redis: Redis, resume: bool, attempts: int, max_try: int
) -> None:
    """Recovery of a lost run applies the resume rule in Lua: PENDING exactly when may_resume says so."""
    job_id = await lost_run(agent, client, redis, resume=resume, attempts=attempts, max_try=max_try)
    assert await JobRecovery(agent.job_store, engine=agent.engine).reconcile(idle_for_ms=0) == 1
    state = await agent.job_store.get(job_id)
    assert state is not None and state.error is not None
    lost = f"WorkerLost: the worker was lost during attempt {attempts}"
    if may_resume(resume=resume, attempts=attempts, max_try=max_try):
        assert state.status is JobStatus.PENDING
        assert state.error == f"{lost}; queued again"
        assert await redis.zscore(agent.engine.names.queue, agent.engine.names.engine_job_id(job_id)) is not None
    else:
        assert state.status is JobStatus.FAILURE
        why = "no attempts left" if resume else "resume is off"
        assert state.error == f"{lost} ({why})"
        assert await redis.zscore(agent.engine.names.queue, agent.engine.names.engine_job_id(job_id)) is None
    assert await redis.zscore(agent.keys.leases, job_id) is None


@pytest.mark.parametrize(("resume", "attempts", "max_try"), LOST_GRID)
async def test_lua_redelivery_rule_agrees_with_may_resume(
    agent: Agent, client: ClientAgent, redis: Redis, resume: bool, attempts: int, max_try: int
) -> None:
    """A redelivery of a run that never finished (start on a STARTED job) follows the same rule."""
    job_id = await lost_run(agent, client, redis, resume=resume, attempts=attempts, max_try=max_try)
    decision = await agent.job_store.start(job_id)
    state = await agent.job_store.get(job_id)
    assert state is not None
    if may_resume(resume=resume, attempts=attempts, max_try=max_try):
        assert decision.run and decision.attempts == attempts + 1
        assert state.status is JobStatus.STARTED
    else:
        assert not decision.run
        assert state.status is JobStatus.FAILURE
        assert state.error is not None and state.error.startswith(ErrorKind.WORKER_LOST.describe(""))


@pytest.mark.parametrize("status", list(JobStatus))
async def test_lua_terminal_set_agrees_with_terminal(
    agent: Agent, client: ClientAgent, redis: Redis, status: JobStatus
) -> None:
    """The cancel script leaves exactly the TERMINAL statuses alone."""
    job_id = await client.enqueue(NotResuming())
    await redis.hset(agent.keys.state(job_id), "status", status.value)
    reply = await agent.job_store.cancel(job_id, engine=agent.engine.ref(job_id))
    after = await agent.job_store.get(job_id)
    assert after is not None
    if status in TERMINAL:
        assert reply is CancelReply.SETTLED and after.status is status
    elif status is JobStatus.STARTED:
        assert reply is CancelReply.REQUESTED and after.status is JobStatus.STARTED
    else:
        assert reply is CancelReply.SETTLED and after.status is JobStatus.CANCELED
