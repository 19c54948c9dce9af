"""Throughput with observability on against off, same fast worker, paired rounds: "on" is the event
stream and the metrics counters (AGENT_EVENTS_ENABLED, AGENT_METRICS_ENABLED), "off" is neither; the
events alone against off (the earlier figure) too; and the Redis memory the stream takes per 10,000
jobs and the metrics hash. Last line: one JSON object.

On a shared machine whole-worker rounds swing with the neighbours' load; so the same run also times
the only place observability adds work, the worker's two store scripts per job (start, then
SUCCESS), in small batches alternating on/off (`scripts_ratio`: slow drifts in load cancel out;
`scripts_metrics_ratio`: the metrics alone, events on in both).

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
from enum import Enum
from typing import Any, ClassVar

from _util import clean, run_worker_subprocess
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, Job, JobRequest, JobStatus, agent_job

_RUNS: list[float] = []


class Mode(Enum):
    """(events, metrics) of one round."""

    ALL_ON = (True, True)
    EVENTS_ONLY = (True, False)
    OFF = (False, False)


@dataclass
class Noop(JobRequest):
    name: ClassVar[str] = "bench.observability.noop"


@agent_job
class NoopJob(Job[Noop]):
    request_class = Noop

    async def process(self, request: Noop, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        _RUNS.append(time.perf_counter())
        return {}


def settings(namespace: str, redis_url: str, mode: Mode) -> AgentSettings:
    events, metrics = mode.value
    return AgentSettings(redis_url=redis_url, namespace=namespace, events_enabled=events, metrics_enabled=metrics)


async def worker_main(namespace: str, redis_url: str, mode: Mode) -> None:
    agent = Agent(settings(namespace, redis_url, mode))
    try:
        await agent.run_worker(burst=True, handle_signals=False)
    finally:
        await agent.close()
    print(json.dumps({"runs": len(_RUNS), "elapsed_s": _RUNS[-1] - _RUNS[0] if len(_RUNS) > 1 else 0.0}))


async def one_round(n: int, redis_url: str, redis: Redis, mode: Mode) -> dict[str, float]:
    namespace = f"bench-obs-{uuid.uuid4().hex[:8]}"
    async with Agent(settings(namespace, redis_url, mode)) as agent:
        client = ClientAgent(agent)
        for start in range(0, n, 200):
            await asyncio.gather(*(client.enqueue(Noop(), "bench") for _ in range(start, min(n, start + 200))))
        figures = run_worker_subprocess(
            __file__, "--namespace", namespace, "--redis-url", redis_url, "--mode", mode.name
        )
        stream_bytes = int(await redis.memory_usage(agent.keys.events, samples=0) or 0)
        metrics_bytes = int(await redis.memory_usage(agent.keys.metrics, samples=0) or 0)
    await clean(redis, namespace)
    return {"jobs_per_s": (figures["runs"] - 1) / figures["elapsed_s"], "stream_bytes": stream_bytes,
            "metrics_bytes": metrics_bytes}


_SCRIPT_BATCH = 100
_SCRIPT_BATCHES = 30


async def _timed_scripts(agent: Agent, client: ClientAgent) -> float:
    """Seconds for one batch of jobs through start + SUCCESS, one script call at a time (as a worker)."""
    ids = await asyncio.gather(*(client.enqueue(Noop(), "bench") for _ in range(_SCRIPT_BATCH)))
    store = agent.job_store
    started = time.perf_counter()
    for job_id in ids:
        await store.start(job_id)
        await store.transition(job_id, JobStatus.SUCCESS, result={})
    return time.perf_counter() - started


async def scripts_ratios(redis_url: str, redis: Redis) -> dict[Mode, list[float]]:
    """Per round of adjacent batches, ALL_ON's throughput over each other mode's (its time / on's)."""
    agents = {mode: Agent(settings(f"bench-obs-{uuid.uuid4().hex[:8]}", redis_url, mode)) for mode in Mode}
    ratios: dict[Mode, list[float]] = {Mode.OFF: [], Mode.EVENTS_ONLY: []}
    try:
        for agent in agents.values():
            await agent.open()
        clients = {mode: ClientAgent(agent) for mode, agent in agents.items()}
        modes = list(Mode)
        for index in range(_SCRIPT_BATCHES):
            # Rotated, so no mode always runs first (on the warmer connection).
            order = modes[index % 3:] + modes[:index % 3]
            seconds = {mode: await _timed_scripts(agents[mode], clients[mode]) for mode in order}
            for other, found in ratios.items():
                found.append(seconds[other] / seconds[Mode.ALL_ON])
    finally:
        for agent in agents.values():
            await agent.close()
            await clean(redis, agent.keys.namespace)
    return ratios


def _ratios(a: list[dict[str, float]], b: list[dict[str, float]]) -> list[float]:
    return [x["jobs_per_s"] / y["jobs_per_s"] for x, y in zip(a, b, strict=True)]


def _median_rate(rounds: list[dict[str, float]]) -> int:
    return round(statistics.median(r["jobs_per_s"] for r in rounds))


async def main(n: int, rounds: int, redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    results: dict[Mode, list[dict[str, float]]] = {mode: [] for mode in Mode}
    for index in range(rounds):
        # Rotated: no mode always runs first (a cold Redis) or last.
        modes = list(Mode)
        for mode in modes[index % 3:] + modes[:index % 3]:
            results[mode].append(await one_round(n, redis_url, redis, mode))
    script_ratios = await scripts_ratios(redis_url, redis)
    await redis.aclose()
    on, events_only, off = results[Mode.ALL_ON], results[Mode.EVENTS_ONLY], results[Mode.OFF]
    ratios, event_ratios = _ratios(on, off), _ratios(events_only, off)
    print(json.dumps({
        "jobs": n, "rounds": rounds,
        "observability_on_jobs_per_s": _median_rate(on),
        "observability_off_jobs_per_s": _median_rate(off),
        "ratio": round(statistics.median(ratios), 3), "ratio_per_round": [round(r, 3) for r in ratios],
        "events_on_jobs_per_s": _median_rate(events_only),
        "events_ratio": round(statistics.median(event_ratios), 3),
        "events_ratio_per_round": [round(r, 3) for r in event_ratios],
        "stream_mb_per_10k_jobs": round(statistics.median(r["stream_bytes"] for r in on) / n * 10_000 / 2**20, 2),
        "metrics_hash_bytes": round(statistics.median(r["metrics_bytes"] for r in on)),
        "scripts_ratio": round(statistics.median(script_ratios[Mode.OFF]), 3),
        "scripts_ratio_quartiles": [round(q, 3) for q in statistics.quantiles(script_ratios[Mode.OFF], n=4)],
        # The metrics alone: events on in both.
        "scripts_metrics_ratio": round(statistics.median(script_ratios[Mode.EVENTS_ONLY]), 3),
    }))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--mode", choices=[m.name for m in Mode], default=Mode.ALL_ON.name)
    parser.add_argument("--namespace")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker_main(args.namespace, args.redis_url, Mode[args.mode]))
    else:
        asyncio.run(main(args.jobs, args.rounds, args.redis_url))
