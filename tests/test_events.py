"""Job events: one per transition, written by the transition's own script; progress; replay."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from redis.asyncio import Redis

from agent_async import (
    Agent,
    AgentError,
    ClientAgent,
    EventType,
    Job,
    JobEvent,
    JobRequest,
    JobStatus,
    agent_job,
    report_progress,
)
from agent_async.worker.progress import ProgressReporter
from tests.conftest import Drain, running_worker, wait_for_status
from tests.jobs import Flaky


@dataclass
class Steps(JobRequest):
    name: ClassVar[str] = "tests.events.steps"
    steps: int = 3
    fail: bool = False
    pause_s: float = 0.0


@agent_job
class StepsJob(Job[Steps]):
    request_class = Steps

    async def process(self, request: Steps, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        for step in range(1, request.steps + 1):
            await report_progress(step / request.steps, f"step {step}", step=step)
            await asyncio.sleep(request.pause_s)
        if request.fail:
            raise ValueError("no")
        return {"steps": request.steps}


async def job_events(client: ClientAgent, job_id: str) -> list[JobEvent]:
    events = []
    async for event in client.events(job_id=job_id, idle_s=0.2):
        if event is None:
            break
        events.append(event)
    return events


async def test_every_transition_has_one_event_in_order(drain: Drain, client: ClientAgent) -> None:
    job_id = await client.enqueue(Steps(steps=1), "alice")
    await drain()
    events = await job_events(client, job_id)
    statuses = [(e.type, e.status) for e in events]
    assert statuses == [
        (EventType.STATUS, JobStatus.PENDING), (EventType.STATUS, JobStatus.STARTED),
        (EventType.PROGRESS, JobStatus.STARTED), (EventType.STATUS, JobStatus.SUCCESS),
    ]
    assert all(e.name == Steps.name and e.user_uid == "alice" for e in events)
    assert [e.event_id for e in events] == sorted(e.event_id for e in events)
    assert events[-1].is_terminal and events[1].attempts == 1


async def test_each_event_carries_the_state_as_its_transition_left_it(
    drain: Drain, client: ClientAgent, agent: Agent
) -> None:
    """Name, user, attempts and error of each event are those of the state right after its
    transition (the scripts pass what they hold rather than read the state again)."""
    job_id = await client.enqueue(Flaky(fail_times=1), "carol")
    await drain()
    events = [e for e in await job_events(client, job_id) if e.type is EventType.STATUS]
    seen = [(e.status, e.attempts, e.error) for e in events]
    retry_error = "ValueError: flaky failure #1"
    assert seen == [
        (JobStatus.PENDING, 0, None),
        (JobStatus.STARTED, 1, None),
        (JobStatus.RETRY, 1, retry_error),
        # The second start still shows the error the retry left; the success clears it.
        (JobStatus.STARTED, 2, retry_error),
        (JobStatus.SUCCESS, 2, None),
    ], seen
    assert {(e.name, e.user_uid) for e in events} == {(Flaky.name, "carol")}
    state = await client.get_state(job_id)
    assert state is not None and (state.attempts, state.error) == (2, None)


async def test_a_cancel_before_start_and_a_failure_have_their_events(drain: Drain, client: ClientAgent) -> None:
    canceled = await client.enqueue(Steps())
    await client.cancel(canceled)
    failed = await client.enqueue(Steps(steps=1, fail=True))
    await drain()
    assert [e.status for e in await job_events(client, canceled)] == [JobStatus.PENDING, JobStatus.CANCELED]
    events = await job_events(client, failed)
    assert events[-1].status is JobStatus.FAILURE and events[-1].error == "ValueError: no"


async def test_progress_is_in_the_state_while_it_runs(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Steps(steps=2, pause_s=0.5))
    async with running_worker(agent):
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            state = await client.get_state(job_id)
            if state is not None and state.progress is not None:
                break
            assert asyncio.get_running_loop().time() < deadline, "no progress seen"
            await asyncio.sleep(0.02)
        assert state.progress["message"] == "step 1" and state.progress["fraction"] == 0.5
        assert state.progress["details"] == {"step": 1}
        done = await wait_for_status(agent, job_id, JobStatus.SUCCESS)
    assert done.progress is not None and done.progress["fraction"] == 1.0, "the last report is kept"


async def test_a_reconnecting_reader_replays_what_it_missed(drain: Drain, client: ClientAgent) -> None:
    first = await client.enqueue(Steps(steps=1))
    seen = [e async for e in _take(client.events(last_event_id="0-0", idle_s=0.2), 1)]
    assert seen[0] is not None and seen[0].job_id == first
    second = await client.enqueue(Steps(steps=1))
    await drain()
    # Reconnect with the last id seen: everything after it, nothing before.
    replay = [e async for e in _take(client.events(last_event_id=seen[0].event_id, idle_s=0.2), 50)]
    events = [e for e in replay if e is not None]
    assert all(_stream_order(e.event_id) > _stream_order(seen[0].event_id) for e in events)
    assert {e.job_id for e in events} == {first, second}
    assert (events[0].job_id, events[0].status) != (first, JobStatus.PENDING), "what was seen is not replayed"


async def test_filters_by_name_user_and_status(drain: Drain, client: ClientAgent) -> None:
    start = await client.enqueue(Steps(steps=1), "bob")
    await client.enqueue(Steps(steps=1), "carol")
    await drain()
    events = client.events(last_event_id="0-0", user_uid="bob", status=JobStatus.SUCCESS, idle_s=0.2)
    found = [e async for e in _take(events, 10) if e is not None]
    assert [(e.job_id, e.status) for e in found] == [(start, JobStatus.SUCCESS)]


async def test_report_progress_outside_a_job_is_an_error() -> None:
    with pytest.raises(AgentError, match=r"inside Job\.process"):
        await report_progress(0.5)
    with pytest.raises(ValueError, match="from 0 to 1"):
        await report_progress(1.5)


async def test_progress_is_coalesced_and_the_last_value_is_kept() -> None:
    writes: list[float] = []

    async def write(fraction: float, message: str | None, details: dict[str, Any]) -> bool:
        writes.append(fraction)
        return True

    reporter = ProgressReporter(write, min_interval_s=0.2)
    for i in range(1, 101):
        await reporter.report(i / 100, None, {})
    await asyncio.sleep(0.25)
    await reporter.report(0.999, None, {})
    await reporter.close()
    assert writes[0] == 0.01 and 1.0 in writes and writes[-1] == 0.999
    assert len(writes) <= 4, f"a tight loop must not write every report: {writes}"


async def test_the_stream_is_capped(agent: Agent, client: ClientAgent, redis: Redis) -> None:
    await client.enqueue(Steps())
    info = await redis.xinfo_stream(agent.keys.events)
    assert info["length"] >= 1
    from agent_async.store.scripts import EVENTS_KEPT
    script = agent.job_store.enqueues.script.source  # the enqueue script caps the stream it writes
    assert f"EVENTS_KEPT = {EVENTS_KEPT}" in script and "MAXLEN', '~', EVENTS_KEPT" in script


def _stream_order(event_id: str) -> tuple[int, int]:
    ms, seq = event_id.split("-")
    return int(ms), int(seq)


async def test_a_new_reader_sees_only_new_events(client: ClientAgent) -> None:
    await client.enqueue(Steps())
    assert [e async for e in _take(client.events(idle_s=0.1), 5)] == []


async def _take(events: Any, n: int) -> Any:
    count = 0
    async for event in events:
        if event is None:
            return
        yield event
        count += 1
        if count >= n:
            return


async def test_events_can_be_turned_off(settings: Any, redis: Redis, job_registry: Any) -> None:
    """AGENT_EVENTS_ENABLED=false: the same lifecycle, no stream written."""
    async with Agent(dataclasses.replace(settings, events_enabled=False)) as quiet:
        client = ClientAgent(quiet)
        job_id = await client.enqueue(Steps(steps=2))
        await client.cancel(job_id)
        state = await client.get_state(job_id)
        assert state is not None and state.status is JobStatus.CANCELED
        assert not await redis.exists(quiet.keys.events)

