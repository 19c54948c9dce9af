"""Cost against the backlog: enqueue and drain rates with 1,000 and 100,000 jobs already queued (and
1,000,000 with --big), the same with as many finished states retained, and Redis memory per queued
job and per retained finished state.

Usage: python benchmarks/scale.py [--big] [--window-s S]

Each backlog size gets a private redis-server (benchmarks/peers.py's RedisServer), so memory is
read off `INFO memory` with nothing else in it. The backlog is queued with ClientAgent.enqueue_many
(deferred an hour, so the drain measures the jobs queued after it, which start at once, and the
backlog stays in the queue ZSET and the indexes the whole time). Then, at that backlog:
`enqueue_per_s` is 20,000 more jobs through enqueue_many; `drain_per_s` is the fast worker
(`benchmarks/throughput.py --worker agent`, one process) running those for `--window-s` seconds.
Memory: `queued_job_bytes` is the used-memory growth per backlog job; `finished_state_bytes` is
the growth per job of 5,000 jobs queued then drained to SUCCESS (JobState hash, its index entries,
its events; arq's result key is not kept). The event stream is capped near 100,000 events, so its
share per job falls for bigger runs. `retained`: the same two rates with that many jobs run to
SUCCESS first (their states, index entries and events kept, as for the retention period), and
the memory growth per one of them. Last line: one JSON object, ratios against the smallest size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_async import Agent, AgentSettings, ClientAgent
from benchmarks.peers import RedisServer
from benchmarks.throughput import Noop, spawn_worker

# Enough jobs that the drain fills its window (a few thousand jobs/s) and the rates are not start-up's.
MEASURED_JOBS = 20_000
FINISHED_JOBS = 5000
BACKLOG_DEFER_S = 3600.0


# Redis gives back a connection's buffers for a big command (enqueue_many sends a batch as one
# argument of a few hundred KB) in its once-a-second client housekeeping: read memory after it.
SETTLE_S = 2.5


async def used_memory(redis: Redis) -> int:
    await asyncio.sleep(SETTLE_S)
    return int((await redis.info("memory"))["used_memory"])


async def enqueue_all(client: ClientAgent, n: int, *, defer_s: float = 0.0) -> float:
    """Queue `n` no-op jobs through enqueue_many; returns jobs per second."""
    started = time.perf_counter()
    for start in range(0, n, 5000):
        results = await client.enqueue_many([Noop() for _ in range(min(5000, n - start))], "bench", defer_s=defer_s)
        if any(r.job_id is None for r in results):
            raise SystemExit("a job was refused while queueing the backlog")
    return n / (time.perf_counter() - started)


def drain_rate(namespace: str, url: str, window_s: float) -> float:
    """Jobs per second the fast worker runs in `window_s` seconds (then SIGTERM)."""
    proc = spawn_worker("agent", namespace, url, burst=False)
    time.sleep(window_s)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    figures = json.loads(out.strip().splitlines()[-1])
    if figures["runs"] < 2:
        raise SystemExit("the worker ran no jobs in the window")
    return float((figures["runs"] - 1) / figures["elapsed_s"])


@dataclass
class Fresh:
    """A private redis-server with one namespace, an Agent on it, and the memory it used before."""

    url: str
    redis: Redis
    namespace: str
    client: ClientAgent
    before_bytes: int


@contextlib.asynccontextmanager
async def fresh_redis() -> AsyncIterator[Fresh]:
    server = RedisServer()
    redis = Redis.from_url(server.url)
    try:
        namespace = f"scale-{uuid.uuid4().hex[:8]}"
        async with Agent(AgentSettings(redis_url=server.url, namespace=namespace)) as agent:
            client = ClientAgent(agent)
            await client.enqueue_many([Noop()], "bench")  # loads the scripts
            yield Fresh(server.url, redis, namespace, client, await used_memory(redis))
    finally:
        await redis.aclose()
        server.stop()


async def at_backlog(backlog: int, window_s: float) -> dict[str, float]:
    async with fresh_redis() as fresh:
        await enqueue_all(fresh.client, backlog, defer_s=BACKLOG_DEFER_S)
        queued_job_bytes = (await used_memory(fresh.redis) - fresh.before_bytes) / backlog
        enqueue_per_s = await enqueue_all(fresh.client, MEASURED_JOBS)
        drain_per_s = drain_rate(fresh.namespace, fresh.url, window_s)
    return {"enqueue_per_s": round(enqueue_per_s), "drain_per_s": round(drain_per_s),
            "queued_job_bytes": round(queued_job_bytes)}


async def at_retained(retained: int, window_s: float) -> dict[str, float]:
    """The same two rates with `retained` finished states kept (run to SUCCESS first: their
    states, index entries, status index and events are what a busy deployment keeps for the
    retention period)."""
    async with fresh_redis() as fresh:
        await enqueue_all(fresh.client, retained)
        proc = spawn_worker("agent", fresh.namespace, fresh.url, burst=True)
        proc.communicate(timeout=3600)
        stats = await fresh.client.queue_stats()
        if stats.depth:
            raise SystemExit(f"{stats.depth} of the jobs to retain were not run")
        state_bytes = (await used_memory(fresh.redis) - fresh.before_bytes) / retained
        enqueue_per_s = await enqueue_all(fresh.client, MEASURED_JOBS)
        drain_per_s = drain_rate(fresh.namespace, fresh.url, window_s)
    return {"enqueue_per_s": round(enqueue_per_s), "drain_per_s": round(drain_per_s),
            "finished_state_bytes": round(state_bytes)}


async def finished_state_bytes() -> float:
    async with fresh_redis() as fresh:
        await enqueue_all(fresh.client, FINISHED_JOBS)
        proc = spawn_worker("agent", fresh.namespace, fresh.url, burst=True)
        proc.communicate(timeout=600)
        return (await used_memory(fresh.redis) - fresh.before_bytes) / FINISHED_JOBS


async def warm_up() -> None:
    """One unrecorded round, so the first backlog measured does not carry this process's first calls."""
    async with fresh_redis() as fresh:
        await enqueue_all(fresh.client, MEASURED_JOBS)


async def main(args: argparse.Namespace) -> None:
    sizes = [1000, 100_000] + ([1_000_000] if args.big else [])
    await warm_up()
    by_size: dict[str, dict[str, float]] = {}
    for size in sizes:
        by_size[str(size)] = figures = await at_backlog(size, args.window_s)
        print(f"backlog {size:>9,}: {figures}", flush=True)
    by_retained: dict[str, dict[str, float]] = {}
    for size in sizes:
        by_retained[str(size)] = figures = await at_retained(size, args.window_s)
        print(f"retained {size:>9,}: {figures}", flush=True)
    state_bytes = await finished_state_bytes()
    print(f"finished state: {state_bytes:.0f} bytes per job", flush=True)
    smallest, largest = str(sizes[0]), str(sizes[-1])

    def ratio(figures: dict[str, dict[str, float]], rate: str) -> float:
        return round(figures[largest][rate] / figures[smallest][rate], 3)

    result: dict[str, Any] = {
        "backlogs": by_size,
        "retained": by_retained,
        "finished_state_bytes": round(state_bytes),
        "queued_job_bytes_at_100k": by_size["100000"]["queued_job_bytes"],
        "finished_state_bytes_at_100k": by_retained["100000"]["finished_state_bytes"],
        "enqueue_ratio_largest_vs_smallest": ratio(by_size, "enqueue_per_s"),
        "drain_ratio_largest_vs_smallest": ratio(by_size, "drain_per_s"),
        "retained_enqueue_ratio_largest_vs_smallest": ratio(by_retained, "enqueue_per_s"),
        "retained_drain_ratio_largest_vs_smallest": ratio(by_retained, "drain_per_s"),
        "window_s": args.window_s,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="also 1,000,000 queued jobs, and retained (minutes, GBs)")
    parser.add_argument("--window-s", type=float, default=6.0)
    asyncio.run(main(parser.parse_args()))
