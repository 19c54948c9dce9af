"""Throughput with the event stream on against off (AGENT_EVENTS_ENABLED), same fast worker, paired
rounds; and the Redis memory the stream takes per 10,000 jobs. Last line: one JSON object.

Usage: python benchmarks/observability.py [--jobs N] [--rounds R] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

from _util import clean, run_worker_subprocess
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, Job, JobRequest, agent_job

_RUNS: list[float] = []


@dataclass
class Noop(JobRequest):
    name: ClassVar[str] = "bench.observability.noop"


@agent_job
class NoopJob(Job[Noop]):
    request_class = Noop

    async def process(self, request: Noop, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        _RUNS.append(time.perf_counter())
        return {}


def settings(namespace: str, redis_url: str, events: bool) -> AgentSettings:
    return AgentSettings(redis_url=redis_url, namespace=namespace, events_enabled=events)


async def worker_main(namespace: str, redis_url: str, events: bool) -> None:
    agent = Agent(settings(namespace, redis_url, events))
    try:
        await agent.run_worker(burst=True, handle_signals=False)
    finally:
        await agent.close()
    print(json.dumps({"runs": len(_RUNS), "elapsed_s": _RUNS[-1] - _RUNS[0] if len(_RUNS) > 1 else 0.0}))




async def one_round(n: int, redis_url: str, redis: Redis, events: bool) -> dict[str, float]:
    namespace = f"bench-obs-{uuid.uuid4().hex[:8]}"
    async with Agent(settings(namespace, redis_url, events)) as agent:
        client = ClientAgent(agent)
        for start in range(0, n, 200):
            await asyncio.gather(*(client.enqueue(Noop(), "bench") for _ in range(start, min(n, start + 200))))
        figures = run_worker_subprocess(
            __file__, "--namespace", namespace, "--redis-url", redis_url, *([] if events else ["--events-off"])
        )
        stream_bytes = int(await redis.memory_usage(agent.keys.events, samples=0) or 0) if events else 0
    await clean(redis, namespace)
    return {"jobs_per_s": (figures["runs"] - 1) / figures["elapsed_s"], "stream_bytes": stream_bytes}


async def main(n: int, rounds: int, redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    on, off = [], []
    for _ in range(rounds):
        on.append(await one_round(n, redis_url, redis, True))
        off.append(await one_round(n, redis_url, redis, False))
    await redis.aclose()
    ratios = [a["jobs_per_s"] / b["jobs_per_s"] for a, b in zip(on, off, strict=True)]
    print(json.dumps({
        "jobs": n, "rounds": rounds,
        "events_on_jobs_per_s": round(statistics.median(r["jobs_per_s"] for r in on)),
        "events_off_jobs_per_s": round(statistics.median(r["jobs_per_s"] for r in off)),
        "ratio": round(statistics.median(ratios), 3), "ratio_per_round": [round(r, 3) for r in ratios],
        "stream_mb_per_10k_jobs": round(statistics.median(r["stream_bytes"] for r in on) / n * 10_000 / 2**20, 2),
    }))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--events-off", action="store_true")
    parser.add_argument("--namespace")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker_main(args.namespace, args.redis_url, not args.events_off))
    else:
        asyncio.run(main(args.jobs, args.rounds, args.redis_url))
