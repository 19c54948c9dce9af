"""Shutdown in every state, through the library's own command (`python -m agent_async worker`):
SIGTERM drains and exits 0 while jobs run, while Redis is unreachable, and an outage is reported
in a few lines, not a traceback a second."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_async import Agent, AgentSettings, ClientAgent, JobStatus
from tests.faults.conftest import ROOT, PrivateRedis, fault_env
from tests.faults.svc.jobs.sleep import Sleep

pytestmark = pytest.mark.slow

DRAIN_S = 2.0


def start_worker(namespace: str, redis_url: str, log: Path) -> subprocess.Popen[bytes]:
    env = fault_env(namespace, redis_url, AGENT_SHUTDOWN_DRAIN_SECONDS=str(DRAIN_S))
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agent_async", "worker", "--jobs", "tests.faults.svc"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )


async def wait_for(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s}s")
        await asyncio.sleep(0.05)


async def test_sigterm_drains_a_running_job_and_exits_0(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path
) -> None:
    """The worker owns its signals by default: SIGTERM lets the running job finish (within the
    drain time), then the process exits 0 without a CancelledError traceback."""
    log = tmp_path / "worker.log"
    proc = start_worker(namespace, private_redis.url, log)
    async with Agent(AgentSettings(redis_url=private_redis.url, namespace=namespace)) as agent:
        client = ClientAgent(agent)
        job_id = await client.enqueue(Sleep(duration_s=1.0))

        async def started() -> bool:
            state = await client.get_state(job_id)
            return state is not None and state.status is JobStatus.STARTED

        await wait_for(started, 20, "job started")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=DRAIN_S + 10)
        state = await client.get_state(job_id)
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text and "CancelledError" not in text, text
    assert state is not None and state.status is JobStatus.SUCCESS, "finished within the drain time"


async def test_sigterm_while_redis_is_unreachable_exits_promptly(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path
) -> None:
    """A worker waiting to reconnect to a Redis that is down stops on SIGTERM within the drain time
    (it used to log the signal and go on retrying until SIGKILL)."""
    log = tmp_path / "worker.log"
    proc = start_worker(namespace, private_redis.url, log)

    async def serving() -> bool:
        return "Starting worker" in log.read_text()

    await wait_for(serving, 20, "worker serving")
    private_redis.stop()
    await asyncio.sleep(2.0)  # the poll loop has failed and is waiting to reconnect
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=DRAIN_S + 5)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the worker ignored SIGTERM while Redis was down:\n{log.read_text()}")
    assert code == 0, log.read_text()
    assert time.monotonic() - t0 < DRAIN_S + 5
    assert "Traceback" not in log.read_text()


async def test_an_outage_is_reported_in_a_few_lines(
    private_redis: PrivateRedis, namespace: str, tmp_path: Path
) -> None:
    """8 s without Redis: one warning when it goes, a summary while it stays away, one line when it
    is back; no traceback (it used to print about 320 lines)."""
    log = tmp_path / "worker.log"
    proc = start_worker(namespace, private_redis.url, log)

    async def serving() -> bool:
        return "Starting worker" in log.read_text()

    try:
        await wait_for(serving, 20, "worker serving")
        before = len(log.read_text().splitlines())
        private_redis.stop()
        await asyncio.sleep(8.0)
        private_redis.start()

        async def back() -> bool:
            return "Redis is reachable again" in log.read_text()

        await wait_for(back, 20, "recovery reported")
        await asyncio.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=DRAIN_S + 10)
    lines = log.read_text().splitlines()[before:]
    ours = [line for line in lines if "agent_async" in line]
    assert "Traceback" not in "\n".join(lines), "\n".join(lines)
    assert sum("Redis is unreachable" in line for line in ours) == 1, ours
    assert sum("Redis is reachable again" in line for line in ours) == 1, ours
    assert len(ours) <= 6, ours
