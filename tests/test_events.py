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
    # Only this test's jobs: a drain at a cron minute also runs the scheduled jobs due then.
    events = [e for e in replay if e is not None and e.name == Steps.name]
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


def _stream_order(event_id: str) -> tuple[int, int, int]:
    """An event id's place: its entry's stream id, then its place in the entry (-1: the entry's only one)."""
    entry, _, k = event_id.partition(".")
    ms, seq = entry.split("-")
    return int(ms), int(seq), int(k) if k else -1


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



async def test_the_events_of_one_call_share_entries_and_a_reader_resumes_inside_one(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """12 jobs queued by one call: their 12 PENDING events in two stream entries (10, then 2), ids
    <entry>.0 on, in the jobs' order; a reader resuming after any of them gets what follows it."""
    results = await client.enqueue_many([Steps(steps=1) for _ in range(12)], "dora")
    ids = [r.job_id for r in results]
    assert await redis.xlen(agent.keys.events) == 2
    events = await agent.events.read()
    assert [(e.job_id, e.status, e.name, e.user_uid, e.attempts) for e in events] == [
        (job_id, JobStatus.PENDING, Steps.name, "dora", 0) for job_id in ids
    ]
    entries = [e.event_id.partition(".") for e in events]
    assert [k for _, _, k in entries] == [str(k) for k in range(10)] + ["0", "1"]
    assert len({entry for entry, _, _ in entries[:10]}) == 1 and entries[10][0] == entries[11][0] != entries[0][0]
    assert _stream_order(events[9].event_id) < _stream_order(events[10].event_id)
    # Resumed inside the first entry, at its end, and after everything.
    assert await agent.events.read(events[3].event_id) == events[4:]
    assert await agent.events.read(events[9].event_id) == events[10:]
    assert await agent.events.read(events[11].event_id) == []
    assert await agent.events.latest(5) == events[-5:]
    assert await agent.events.latest(2, job_id=ids[4]) == [events[4]]
    # A call of one job writes an entry of its own fields, its id the entry's.
    single = await client.enqueue(Steps(steps=1), "dora")
    (last,) = await agent.events.read(events[11].event_id)
    assert (last.job_id, last.status) == (single, JobStatus.PENDING) and "." not in last.event_id
    assert await agent.events.read(last.event_id) == []
    replay = [e async for e in _take(client.events(last_event_id=events[7].event_id, idle_s=0.1), 10)]
    assert [e.event_id for e in replay] == [e.event_id for e in events[8:]] + [last.event_id]


async def test_a_reader_inside_an_entry_that_was_trimmed_goes_on_after_it(
    agent: Agent, client: ClientAgent, redis: Redis
) -> None:
    """The capped stream dropped the entry a reader stopped inside: it gets the entries after it."""
    first = await client.enqueue_many([Steps(steps=1) for _ in range(3)])
    later = await client.enqueue(Steps(steps=1))
    events = await agent.events.read()
    assert [e.job_id for e in events] == [r.job_id for r in first] + [later]
    assert "." in events[1].event_id, "the first three share an entry"
    await redis.xtrim(agent.keys.events, maxlen=1, approximate=False)
    assert [e.job_id for e in await agent.events.read(events[1].event_id)] == [later]
