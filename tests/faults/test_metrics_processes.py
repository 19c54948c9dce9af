"""Metrics across real processes: worker processes count into Redis, the API serves the sum.

Worker A runs the first batch alone and is then SIGKILLed; worker B runs the second batch alone.
The API, served by hypercorn and scraped over HTTP, shows exactly both batches' counts (nothing
lost with the killed worker, nothing counted twice), and the dead worker drops out of workers_alive.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config
from prometheus_client.parser import text_string_to_metric_families

from agent_async import Agent, AgentSettings, ClientAgent, JobStatus
from app.factory import create_app
from app.settings import AppSettings
from tests.conftest import REDIS_URL
from tests.faults.jobs import OnceUpsert

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TOKEN = "metrics-token-0123456789abcdef"
JOB = OnceUpsert.name

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
async def http(namespace: str, tmp_path: Path, redis: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The reference app served by hypercorn on 127.0.0.1, with a metrics token."""
    settings = AppSettings(
        agent=AgentSettings(
            redis_url=REDIS_URL, namespace=namespace, database_url=f"sqlite+aiosqlite:///{tmp_path}/a.db"
        ),
        secret_key="test-secret-key-0123456789abcdef",
        metrics_token=TOKEN,
    )
    app = create_app(settings)
    config = Config()
    port = _free_port()
    config.bind = [f"127.0.0.1:{port}"]
    config.graceful_timeout = 1.0
    config.accesslog = None
    stop = asyncio.Event()
    server = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        for _ in range(200):
            try:
                if (await client.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.02)
        else:
            raise AssertionError("the server did not start")
        try:
            yield client
        finally:
            stop.set()
            await asyncio.wait_for(server, 10)


async def scrape(http: httpx.AsyncClient) -> Samples:
    response = await http.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((f"agent_async_{name}", frozenset(labels.items())), 0.0)


async def until_terminal(client: ClientAgent, job_ids: Sequence[str], timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        states = [await client.get_state(job_id) for job_id in job_ids]
        if all(s is not None and s.is_terminal for s in states):
            return
        await asyncio.sleep(0.05)
    pytest.fail("the workload did not finish")


async def until_workers(http: httpx.AsyncClient, count: int, timeout_s: float = 15) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if value(await scrape(http), "workers_alive") == count:
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"workers_alive never became {count}")


async def batch(client: ClientAgent, *, ok: int, failing: int) -> list[str]:
    ids = [await client.enqueue(OnceUpsert(duration_s=0.01), "user-metrics") for _ in range(ok)]
    # A payload the job's own code trips over (asyncio.sleep of a string): a FAILURE in the worker.
    bad = OnceUpsert(duration_s="oops")  # type: ignore[arg-type]
    return ids + [await client.enqueue(bad, "user-metrics") for _ in range(failing)]


async def test_counts_from_two_worker_processes_sum_exactly(
    http: httpx.AsyncClient, workers: Any, namespace: str
) -> None:
    async with Agent(AgentSettings(redis_url=REDIS_URL, namespace=namespace)) as agent:
        client = ClientAgent(agent)
        group = workers(namespace, REDIS_URL)
        first = group.start()
        await until_workers(http, 1)
        ids_a = await batch(client, ok=6, failing=2)
        await until_terminal(client, ids_a)
        # Worker A's counts are in Redis already: a SIGKILL takes none of them away.
        group.kill(first)
        canceled = await client.enqueue(OnceUpsert(), "user-metrics")
        assert (await client.cancel(canceled)) is not None
        group.start()
        ids_b = await batch(client, ok=5, failing=1)
        await until_terminal(client, ids_b)

        states = [await client.get_state(job_id) for job_id in [*ids_a, *ids_b]]
        assert sum(1 for s in states if s is not None and s.status is JobStatus.SUCCESS) == 11

        # A's heartbeat expires after its lease: only B is alive.
        await until_workers(http, 1)
        samples = await scrape(http)
        assert value(samples, "jobs_enqueued_total", job=JOB) == 8 + 1 + 6
        assert value(samples, "jobs_finished_total", job=JOB, status="success") == 11
        assert value(samples, "jobs_finished_total", job=JOB, status="failure") == 3
        assert value(samples, "jobs_finished_total", job=JOB, status="canceled") == 1
        assert value(samples, "job_duration_seconds_count", job=JOB) == 14, "the canceled job never ran"
        assert value(samples, "job_queue_wait_seconds_count", job=JOB) == 14
        assert value(samples, "jobs_in_progress", job=JOB) == 0
        assert value(samples, "queue_depth") == 0
        assert value(samples, "workers_alive") == 1
        labels = {v for _, label_set in samples for k, v in label_set if k != "le"}
        assert not labels & {*ids_a, *ids_b, canceled, "user-metrics"}
