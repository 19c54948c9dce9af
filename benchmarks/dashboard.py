"""Latency of the dashboard's pages with 100,000 finished and 1,000 queued jobs, over real HTTP.

Usage: python benchmarks/dashboard.py [--finished N] [--queued N] [--requests R] [--redis-url URL]

The finished jobs are written straight into a private namespace with the store's own layout (KeySpace,
state_to_hash, the indexes and hourly counters lib.lua's end_job keeps), pipelined, in a few seconds;
the queued ones go through the real enqueue (so the engine's queue holds them). The app is served by
`python -m app api` (hypercorn, one process); one keep-alive connection, signed in with a session
cookie, asks each page R times after a warm-up: the jobs list (first page, by status, by job type,
by both) and the overview. The baseline is GET /health on the same server (a Redis PING): the ratio
says what a page costs above the cheapest round trip. Target: p99 <= 100 ms per page.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_async import AgentSettings, JobRequest, JobState, JobStatus  # noqa: E402
from agent_async.lifecycle import now_ms  # noqa: E402
from agent_async.store.keys import KeySpace  # noqa: E402
from agent_async.store.schema import state_to_hash  # noqa: E402
from app.dashboard.session import DashboardRole, DashboardSigner  # noqa: E402
from benchmarks._util import clean  # noqa: E402

SECRET = "benchmark-secret-key-0123456789"
JOB_TYPES = ("bench.sync", "bench.export", "bench.import", "bench.mail")
USERS = 200
BATCH = 2000
WARMUP = 20
TARGET_P99_MS = 100.0
# How the finished jobs ended (a long tail of failures and cancels, as in production).
OUTCOMES = ((JobStatus.SUCCESS, 0.90), (JobStatus.FAILURE, 0.08), (JobStatus.CANCELED, 0.02))


@dataclass
class Queued(JobRequest):
    name: ClassVar[str] = "bench.queued"
    n: int = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def write_finished(redis: Redis, keys: KeySpace, count: int, retention_s: int) -> None:
    """`count` ended jobs over the last six days, with every index entry end_job would have written."""
    rng = random.Random(15)
    now = now_ms()
    span_ms = 6 * 86_400_000
    statuses = [s for s, _ in OUTCOMES]
    weights = [w for _, w in OUTCOMES]
    for start in range(0, count, BATCH):
        async with redis.pipeline(transaction=False) as pipe:
            for n in range(start, min(count, start + BATCH)):
                created = now - span_ms + (span_ms * n) // count
                finished = created + rng.randint(200, 5000)
                name = JOB_TYPES[n % len(JOB_TYPES)]
                status = rng.choices(statuses, weights)[0]
                state = JobState(
                    job_id=uuid.uuid4().hex, name=name, user_uid=f"user-{n % USERS}", status=status,
                    payload={"n": n}, result={"ok": True} if status is JobStatus.SUCCESS else None,
                    error="RuntimeError: bench" if status is JobStatus.FAILURE else None, attempts=1,
                    created_ms=created, started_ms=created + 50, finished_ms=finished,
                )
                key = keys.state(state.job_id)
                pipe.hset(key, mapping={**state_to_hash(state, resume=False, max_try=1), "updated_ms": finished})
                pipe.expire(key, retention_s)
                pipe.zadd(keys.all_index, {state.job_id: created})
                pipe.zadd(keys.name_index(name), {state.job_id: created})
                pipe.zadd(keys.user_index(state.user_uid or ""), {state.job_id: created})
                pipe.zadd(keys.status_index(status.value), {state.job_id: finished})
                pipe.hincrby(keys.ended_counts(finished // 3_600_000), f"{name}|{status.value}", 1)
            await pipe.execute()


async def enqueue_queued(settings: AgentSettings, count: int) -> None:
    from agent_async import Agent, ClientAgent
    from agent_async.testing import scoped_registry

    with scoped_registry() as registry:
        registry.add_request(Queued)
        async with Agent(settings) as agent:
            client = ClientAgent(agent)
            for start in range(0, count, 100):
                await asyncio.gather(*(
                    client.enqueue(Queued(n=n), f"user-{n % USERS}", defer_s=3600.0)
                    for n in range(start, min(count, start + 100))
                ))


def start_api(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", str(port)], env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the API did not start")


def percentile_ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[max(0, int(len(ordered) * q) - 1)] * 1000, 2)


async def measure(port: int, pages: dict[str, str], requests: int) -> dict[str, dict[str, float]]:
    token = DashboardSigner(SECRET, token_max_age_s=60, session_max_age_s=3600).issue_sign_in(
        "bench", DashboardRole.VIEWER
    )
    figures: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        signed = await http.post("/admin/ui/login", data={"token": token})
        if signed.status_code != 303:
            raise RuntimeError(f"sign-in failed: {signed.status_code}")
        for label, path in pages.items():
            for _ in range(WARMUP):
                await http.get(path)
            samples = []
            rows = 0
            for _ in range(requests):
                t0 = time.perf_counter()
                response = await http.get(path)
                samples.append(time.perf_counter() - t0)
                if response.status_code != 200:
                    raise RuntimeError(f"{path}: {response.status_code}")
                rows = len(re.findall(r'<tr data-job-id="', response.text))
            figures[label] = {"p50_ms": percentile_ms(samples, 0.5), "p99_ms": percentile_ms(samples, 0.99),
                              "rows": rows}
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--queued", type=int, default=1_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--redis-url", default=os.environ.get("AGENT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()

    from app.migrate import upgrade

    namespace = f"bench-dash-{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-dash-"))
    database_url = f"sqlite+aiosqlite:///{workdir}/app.db"
    upgrade(database_url)
    settings = AgentSettings(redis_url=args.redis_url, namespace=namespace, database_url=database_url)
    keys = KeySpace(namespace)
    redis = Redis.from_url(args.redis_url)
    env = {**os.environ, "AGENT_SECRET_KEY": SECRET, "AGENT_NAMESPACE": namespace, "AGENT_REDIS_URL": args.redis_url,
           "AGENT_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    api = None
    try:
        t0 = time.perf_counter()
        await write_finished(redis, keys, args.finished, settings.state_retention_s)
        await enqueue_queued(settings, args.queued)
        seed_s = time.perf_counter() - t0
        port = free_port()
        api = start_api(env, port)
        pages = {
            "health_baseline": "/health",
            "jobs_first_page": "/admin/ui/jobs",
            "jobs_by_status": "/admin/ui/jobs?status=FAILURE",
            "jobs_by_type": f"/admin/ui/jobs?job={JOB_TYPES[1]}",
            "jobs_by_type_and_status": f"/admin/ui/jobs?job={JOB_TYPES[1]}&status=CANCELED",
            "jobs_queued": "/admin/ui/jobs?status=PENDING",
            "overview": "/admin/ui/",
        }
        figures = await measure(port, pages, args.requests)
    finally:
        if api is not None:
            api.terminate()
            api.wait(15)
        await clean(redis, namespace)
        await redis.aclose()
    baseline = figures["health_baseline"]["p50_ms"] or 0.01
    measured = {k: v for k, v in figures.items() if k != "health_baseline"}
    for label, page in measured.items():
        print(f"{label:26s} p50 {page['p50_ms']:7.2f} ms  p99 {page['p99_ms']:7.2f} ms  rows {page['rows']:.0f}")
    result: dict[str, Any] = {
        "benchmark": "dashboard",
        "finished_jobs": args.finished,
        "queued_jobs": args.queued,
        "requests_per_page": args.requests,
        "seed_s": round(seed_s, 1),
        "health_p50_ms": figures["health_baseline"]["p50_ms"],
        **{f"{label}_p50_ms": page["p50_ms"] for label, page in measured.items()},
        **{f"{label}_p99_ms": page["p99_ms"] for label, page in measured.items()},
        **{f"{label}_p50_vs_health": round(page["p50_ms"] / baseline, 1) for label, page in measured.items()},
        "target_p99_ms": TARGET_P99_MS,
        "target_met": all(page["p99_ms"] <= TARGET_P99_MS for page in measured.values()),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
