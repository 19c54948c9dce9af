"""Fan-out: 10,000 no-op children in one group with a finalizer, against the same 10,000 no-op jobs
enqueued one by one, drained by the same fast worker (one process, burst mode, AgentSettings
defaults), in paired rounds; the median of each figure is printed.

Usage: python benchmarks/fanout.py [--jobs N] [--rounds R] [--redis-url URL]

- group_jobs_per_s / plain_jobs_per_s: children (jobs) run per second inside the worker, between
  its first and its last run (start-up not counted); ratio = group / plain.
- finalizer_delay_ms: from the end of the last child's process() to the start of the finalizer's,
  both clocked in the worker process: the terminal write, the finalizer queued in the same script,
  and its pickup.
- group_create_ms: enqueue_group of all the children (one script call).
- guard_acquire_us_p50: one uncontended ConnectionGuard acquire + release, if the guard exists.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

from _util import clean, run_worker_subprocess
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, GroupFinalizer, Job, JobRequest, agent_job

# Wall-clock marks of this worker process: (kind, time.time()) per run.
_MARKS: list[tuple[str, float]] = []


@dataclass
class Noop(JobRequest):
    name: ClassVar[str] = "bench.fanout.noop"


@dataclass
class Final(GroupFinalizer):
    name: ClassVar[str] = "bench.fanout.final"


@agent_job
class NoopJob(Job[Noop]):
    request_class = Noop

    async def process(self, request: Noop, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        _MARKS.append(("start", time.time()))
        _MARKS.append(("end", time.time()))
        return {}


@agent_job
class FinalJob(Job[Final]):
    request_class = Final

    async def process(self, request: Final, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        _MARKS.append(("final", time.time()))
        return {}


async def worker_main(namespace: str, redis_url: str) -> None:
    logging.basicConfig(level=logging.WARNING)
    agent = Agent(AgentSettings(redis_url=redis_url, namespace=namespace))
    try:
        await agent.run_worker(burst=True, handle_signals=False)
    finally:
        await agent.close()
    starts = [t for kind, t in _MARKS if kind == "start"]
    ends = [t for kind, t in _MARKS if kind == "end"]
    finals = [t for kind, t in _MARKS if kind == "final"]
    print(json.dumps({
        "runs": len(starts),
        "elapsed_s": starts[-1] - starts[0] if len(starts) > 1 else 0.0,
        "finalizer_delay_ms": (finals[0] - ends[-1]) * 1000 if finals and ends else None,
        "finalizers": len(finals),
    }))






async def group_round(n: int, redis_url: str, redis: Redis) -> dict[str, Any]:
    namespace = f"bench-fanout-{uuid.uuid4().hex[:8]}"
    async with Agent(AgentSettings(redis_url=redis_url, namespace=namespace)) as agent:
        t0 = time.perf_counter()
        await ClientAgent(agent).enqueue_group([Noop() for _ in range(n)], Final())
        create_ms = (time.perf_counter() - t0) * 1000
    figures = run_worker_subprocess(__file__, "--namespace", namespace, "--redis-url", redis_url)
    await clean(redis, namespace)
    assert figures["runs"] == n and figures["finalizers"] == 1, figures
    return {"jobs_per_s": (n - 1) / figures["elapsed_s"], "create_ms": create_ms,
            "finalizer_delay_ms": figures["finalizer_delay_ms"]}


async def plain_round(n: int, redis_url: str, redis: Redis) -> dict[str, Any]:
    namespace = f"bench-plain-{uuid.uuid4().hex[:8]}"
    async with Agent(AgentSettings(redis_url=redis_url, namespace=namespace)) as agent:
        client = ClientAgent(agent)
        for start in range(0, n, 200):
            await asyncio.gather(*(client.enqueue(Noop()) for _ in range(start, min(n, start + 200))))
    figures = run_worker_subprocess(__file__, "--namespace", namespace, "--redis-url", redis_url)
    await clean(redis, namespace)
    assert figures["runs"] == n, figures
    return {"jobs_per_s": (n - 1) / figures["elapsed_s"]}


async def guard_acquire_us(redis_url: str) -> float | None:
    try:
        from agent_async.guard import ConnectionGuard
    except ImportError:
        return None
    redis = Redis.from_url(redis_url)
    guard = ConnectionGuard(redis, namespace=f"bench-guard-{uuid.uuid4().hex[:8]}")
    samples = []
    for _ in range(1000):
        t0 = time.perf_counter()
        async with guard.request("bench:host"):
            pass
        samples.append((time.perf_counter() - t0) * 1e6)
    await clean(redis, guard.namespace if hasattr(guard, "namespace") else "bench-guard")
    await redis.aclose()
    return round(statistics.median(samples), 1)


async def main(n: int, rounds: int, redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    group, plain = [], []
    for _ in range(rounds):
        group.append(await group_round(n, redis_url, redis))
        plain.append(await plain_round(n, redis_url, redis))
    await redis.aclose()
    ratios = [g["jobs_per_s"] / p["jobs_per_s"] for g, p in zip(group, plain, strict=True)]
    print(json.dumps({
        "jobs": n,
        "rounds": rounds,
        "group_jobs_per_s": round(statistics.median(g["jobs_per_s"] for g in group)),
        "plain_jobs_per_s": round(statistics.median(p["jobs_per_s"] for p in plain)),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_per_round": [round(r, 3) for r in ratios],
        "finalizer_delay_ms": round(statistics.median(g["finalizer_delay_ms"] for g in group), 2),
        "group_create_ms": round(statistics.median(g["create_ms"] for g in group), 1),
        "guard_acquire_us_p50": await guard_acquire_us(redis_url),
    }))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--namespace")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker_main(args.namespace, args.redis_url))
    else:
        asyncio.run(main(args.jobs, args.rounds, args.redis_url))
