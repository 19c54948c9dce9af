"""A stop's cancel reaches the fast worker's loop even when it lands in the same loop turn as the
event that loop waits for (Python 3.11's asyncio.wait_for swallowed it: gh-86296)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agent_async import Agent
from agent_async.engine.wakeup import Idle, Wait
from agent_async.engine.worker import FastWorker
from tests.jobs import Echo


async def built_worker(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> FastWorker:
    """The fast worker Agent.run_worker builds (for the jobs of tests.jobs, Echo's among them), not
    started: no Redis is needed for its waits."""
    assert Echo.name
    built: dict[str, FastWorker] = {}

    async def keep(worker: FastWorker, outage: Any) -> None:
        built["worker"] = worker

    monkeypatch.setattr("agent_async.engine.run_surviving_redis", keep)
    await agent.run_worker(handle_signals=False)
    return built["worker"]


async def test_a_cancel_as_a_slot_frees_stops_the_wait_for_a_slot(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """arq's SIGTERM cancels the running jobs and the worker's loop in one turn: the jobs' ends free
    their slots in the next, with the loop's cancel. The loop must end, not go on waiting."""
    worker = await built_worker(agent, monkeypatch)
    worker.job_counter = worker.max_jobs  # every slot busy: the loop waits for one to free
    worker._last_health_check = time.time()  # as after its first iteration: no health record due
    waiting = asyncio.create_task(worker._wait_for_work(Wait(Idle.SLOT)))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiting.done()
    worker._slot_freed.set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 1)
