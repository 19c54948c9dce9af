"""Helpers for the tests of services that use agent_async: drain a worker in-process, wait for a
status, declare throw-away jobs, run a worker in the background.

    async with Agent(settings) as agent:
        job_id = await ClientAgent(agent).enqueue(MyRequest(x=1))
        await drain(agent)                                   # runs every queued job, then returns
        state = await wait_for_status(agent, job_id, JobStatus.SUCCESS)

Each test should use its own `AgentSettings(namespace=...)` so tests never see each other's keys.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from agent_async.agent import Agent
from agent_async.errors import AgentError
from agent_async.lifecycle import TERMINAL, JobStatus
from agent_async.registry import JobRegistry, registry
from agent_async.state import JobState

__all__ = ["WaitTimeoutError", "drain", "running_worker", "scoped_registry", "wait_for_status"]


class WaitTimeoutError(AgentError, AssertionError):
    """A job did not reach the awaited status in time (an AssertionError: a test failure)."""


async def drain(agent: Agent, *, stock_worker: bool = False, **overrides: Any) -> None:
    """Run a worker in this event loop until the queue is empty (arq's burst mode): no sleeps.

    `stock_worker=True` runs arq's own Worker (what `arq module.WorkerSettings` starts) instead of
    the fast worker of `Agent.run_worker`; both must give the same outcomes.
    """
    options: dict[str, Any] = {"poll_delay": 0, "handle_signals": False, **overrides}
    await agent.run_worker(burst=True, stock_worker=stock_worker, **options)


@asynccontextmanager
async def running_worker(agent: Agent, **overrides: Any) -> AsyncIterator[asyncio.Task[None]]:
    """A fast worker serving in the background for the duration of the block, then stopped."""
    task = asyncio.create_task(agent.run_worker(**{"poll_delay": 0.005, "handle_signals": False, **overrides}))
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_for_status(
    agent: Agent, job_id: str, *statuses: JobStatus, timeout_s: float = 10.0, poll_s: float = 0.02
) -> JobState:
    """Poll a job's state until it has one of `statuses`; WaitTimeoutError after `timeout_s`."""
    wanted = statuses or tuple(TERMINAL)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        state = await agent.job_store.get(job_id)
        if state is not None and state.status in wanted:
            return state
        if loop.time() > deadline:
            shown = sorted(s.value for s in wanted)
            raise WaitTimeoutError(f"job {job_id} did not reach {shown} within {timeout_s}s: {state}")
        await asyncio.sleep(poll_s)


@contextmanager
def scoped_registry() -> Iterator[JobRegistry]:
    """Jobs declared inside the block are forgotten after it (the process-wide registry)."""
    with registry.scoped() as scoped:
        yield scoped
