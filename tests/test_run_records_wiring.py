"""Run records wired into the worker and the canceller: stale runs ended at worker start, a job
cancelled through the canceller records its run cancelled."""

from __future__ import annotations

import time

from agent_async import Agent, AgentSettings, ClientAgent, RunRecords, RunStatus, RunTrigger
from agent_async.storage import upgrade_async
from tests.conftest import Drain
from tests.jobs import Echo
from tests.test_groups import Child, Final


async def test_a_worker_start_ends_runs_left_running_by_a_lost_worker(
    drain: Drain, agent: Agent, settings: AgentSettings, client: ClientAgent
) -> None:
    await upgrade_async(settings.database_url)
    past = RunRecords(settings.database_url, namespace=settings.namespace, clock=lambda: time.time() - 10_000)
    try:
        lost = await past.start("tests.sweep", triggered_by=RunTrigger.SCHEDULED)
    finally:
        await past.close()
    fresh = await agent.runs.start("tests.sweep.other", triggered_by=RunTrigger.MANUAL)
    await client.enqueue(Echo(text="x"))
    await drain()  # a worker starts
    stale = await agent.runs.get(lost.run_id)
    assert stale is not None and stale.status is RunStatus.ERROR and stale.error == "stale: worker lost"
    alive = await agent.runs.get(fresh.run_id)
    assert alive is not None and alive.status is RunStatus.RUNNING


async def test_cancel_records_the_jobs_run_cancelled(
    agent: Agent, settings: AgentSettings, client: ClientAgent
) -> None:
    await upgrade_async(settings.database_url)
    job_id = await client.enqueue(Echo(text="x"))
    run = await agent.runs.start("tests.sweep", triggered_by=RunTrigger.MANUAL, job_id=job_id)
    await client.cancel(job_id)
    ended = await agent.runs.get(run.run_id)
    assert ended is not None and ended.status is RunStatus.CANCELLED


async def test_without_run_records_a_worker_still_starts(drain: Drain, client: ClientAgent) -> None:
    """A database without the run table (not migrated): the stale check is skipped, jobs run."""
    job_id = await client.enqueue(Echo(text="x"))
    await drain()
    state = await client.get_state(job_id)
    assert state is not None and state.status == "SUCCESS"


async def test_cancel_run_cancels_the_group_of_a_run_whose_job_has_ended(
    agent: Agent, settings: AgentSettings, client: ClientAgent, drain: Drain
) -> None:
    """A sweep's job ends once it has fanned out; its group runs on. Cancelling the run must stop
    the group (the dashboard once cancelled only the ended job, leaving the group running)."""
    await upgrade_async(settings.database_url)
    sweep_id = await client.enqueue(Echo(text="sweep"))
    await drain()
    group_id = await client.enqueue_group([Child() for _ in range(3)], Final(), max_in_flight=1)
    run = await agent.runs.start("tests.sweep", triggered_by=RunTrigger.MANUAL, job_id=sweep_id)
    await agent.runs.heartbeat(run.run_id, group_id=group_id)
    run = await agent.runs.get(run.run_id)
    assert run is not None
    ended = await client.cancel_run(run, reason="cancelled by ops")
    assert ended.status is RunStatus.CANCELLED and ended.error == "cancelled by ops"
    view = await client.get_group(group_id)
    assert view is not None and view.canceled == 3 and view.succeeded == 0
