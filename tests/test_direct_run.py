"""The fast worker runs a job its claim picked up in the job's own task (engine/direct.py): no
second task for arq's function, the same outcomes, and arq's run_job for what is off that path."""

from __future__ import annotations

import asyncio

import pytest

from agent_async import Agent, ClientAgent, JobStatus
from agent_async.engine.claim import PickedUp
from agent_async.engine.direct import DirectRun
from agent_async.engine.wire import wire_dumps
from agent_async.testing import running_worker, wait_for_status
from tests.conftest import run_burst
from tests.jobs import Boom, Echo, Flaky, Sleeper, runs_key


def _function_tasks() -> list[asyncio.Task[object]]:
    """Tasks whose coroutine is a job function itself (arq's second task, under asyncio.wait_for)."""
    return [t for t in asyncio.all_tasks() if t.get_coro().__qualname__.startswith("agent_job[")]


@pytest.mark.parametrize("stock_worker", [False, True], ids=["fast_worker", "stock_worker"])
async def test_a_picked_up_job_runs_in_its_own_task_without_a_second_one(
    agent: Agent, client: ClientAgent, stock_worker: bool
) -> None:
    job_id = await client.enqueue(Sleeper(sleep_s=0.3))
    task = asyncio.create_task(agent.run_worker(poll_delay=0.005, handle_signals=False, stock_worker=stock_worker))
    try:
        await wait_for_status(agent, job_id, JobStatus.STARTED)
        await asyncio.sleep(0.05)  # well inside the attempt
        # arq's run_job starts the function as a task of its own; the fast worker runs it in the
        # job's task (the stock worker is the control: the probe does see arq's task).
        assert len(_function_tasks()) == (1 if stock_worker else 0)
        state = await wait_for_status(agent, job_id, JobStatus.SUCCESS, timeout_s=10)
        assert state.result == {"slept": 0.3}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_outcomes_through_the_direct_run_match_arqs(agent: Agent, client: ClientAgent) -> None:
    ok = await client.enqueue(Echo(text="hi"))
    boom = await client.enqueue(Boom())
    flaky = await client.enqueue(Flaky(fail_times=1))
    await run_burst(agent)
    assert (await agent.job_store.get(ok)).status is JobStatus.SUCCESS
    failed = await agent.job_store.get(boom)
    assert failed.status is JobStatus.FAILURE and failed.error
    retried = await agent.job_store.get(flaky)
    assert (retried.status, retried.attempts) == (JobStatus.SUCCESS, 2)


async def test_a_stop_ends_a_running_direct_job_as_arqs_cancel_did(agent: Agent, client: ClientAgent) -> None:
    job_id = await client.enqueue(Sleeper(sleep_s=30))
    async with running_worker(agent):
        await wait_for_status(agent, job_id, JobStatus.STARTED)
        await asyncio.sleep(0.05)
    # The stop's cancel reached the job's own task: its clean-up ran, and its outcome (no resume:
    # a failure) was written in the finish; arq keeps the job queued, as it does after a cancel.
    state = await agent.job_store.get(job_id)
    assert state.status is JobStatus.FAILURE
    assert "interrupted by worker shutdown" in (state.error or "")
    assert await agent.job_store.redis.hget(runs_key(agent.settings.namespace) + ":cleanup", job_id) == b"1"
    assert (await agent.engine.views([job_id]))[job_id].queued


class _Probe(DirectRun):
    """Only what direct_job reads: the functions and arq's limits."""

    def __init__(self, agent: Agent) -> None:  # no arq Worker set-up: direct_job needs none of it
        settings = agent.worker_settings()
        self.functions = {f.name: f for f in settings["functions"]}
        self.job_deserializer = settings["job_deserializer"]
        self.max_tries = 5
        self.keep_result_s = settings["keep_result"]
        self.keep_result_forever = False


def _record(function: str, *, tries: int = 0) -> bytes:
    return wire_dumps({"f": function, "a": ({},), "k": {}, "t": tries, "et": 1})


@pytest.mark.parametrize(
    ("picked", "direct"),
    [
        (PickedUp(_record("tests.echo"), 1, 0, None), True),
        (PickedUp(None, 1, 0, None), False),  # the record expired: arq fails it
        (PickedUp(_record("tests.echo"), 1, 1, None), False),  # aborted before it started
        (PickedUp(_record("no.such.job"), 1, 0, None), False),  # not a function of this worker
        (PickedUp(b"\x00not json", 1, 0, None), False),  # arq's deserializing error
        (PickedUp(_record("tests.echo"), 99, 0, None), False),  # past arq's try limit
        (PickedUp(_record("tests.echo", tries=3), 1, 0, None), False),  # enqueued with more tries
    ],
    ids=["common", "expired", "aborted", "unknown", "undecodable", "too_many_tries", "enqueue_try"],
)
def test_only_the_common_path_runs_directly(agent: Agent, picked: PickedUp, direct: bool) -> None:
    job = _Probe(agent).direct_job(picked)
    assert (job is not None) == direct
    if job is not None:
        assert (job.function.name, job.args, job.kwargs) == ("tests.echo", [{}], {})
