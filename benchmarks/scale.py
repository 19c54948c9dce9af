"""Cost against the backlog: enqueue and drain rates with 1,000 and 100,000 jobs already queued (and
1,000,000 with --big), the same with as many finished states retained, and Redis memory per queued
job and per retained finished state.

Usage: python benchmarks/scale.py [--big] [--window-s S] [--rounds R]

Each backlog size gets a private redis-server (benchmarks/peers.py's RedisServer), so memory is
read off `INFO memory` with nothing else in it. The backlog is queued with ClientAgent.enqueue_many
(deferred an hour, so the drain measures the jobs queued after it, which start at once, and the
backlog stays in the queue ZSET and the indexes the whole time). Then, at that backlog:
`enqueue_per_s` is 20,000 more jobs through enqueue_many; `drain_per_s` is the fast worker
(`benchmarks/throughput.py --worker agent`, one process) running those for `--window-s` seconds.
Memory: `queued_job_bytes` is the used-memory growth per backlog job; `finished_state_bytes` is
the growth per job of 5,000 jobs queued then drained to SUCCESS (JobState hash, its index entries,
its events; arq's result key is not kept). The event stream is capped (store/scripts.py's
EVENTS_KEPT entries of up to EVENTS_PER_ENTRY events each: at most some 58 MB whatever the number
of jobs), so its share per job falls for bigger runs: each memory figure also comes
`_without_events`, the growth less the stream's own (`MEMORY USAGE`), what a job costs once the
stream is full. `retained`: the same two rates with that many jobs run to SUCCESS first (their
states, index entries and events kept, as for the retention period), and the memory growth per
one of them. Last line: one JSON object, ratios against the smallest size.

The sizes run one after the other, minutes apart with --big, and this machine's speed drifts by a
fifth over that long: with `--rounds 2` (or more) every second round runs them in the reverse
order (1k, 100k, 1M, then 1M, 100k, 1k), so a steady drift weighs on each size alike, and each
figure is the median over the rounds (with two, their mean).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
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
    """A private redis-server with one namespace, an Agent on it, and the memory it used before
    (all of it, and its event stream's)."""

    url: str
    redis: Redis
    namespace: str
    client: ClientAgent
    before_bytes: int
    before_events_bytes: int


async def events_bytes(redis: Redis, namespace: str) -> int:
    """The event stream's memory (every node counted: SAMPLES 0)."""
    used = await redis.memory_usage(f"{namespace}:events", samples=0)
    return int(used or 0)


async def grown(fresh: Fresh, jobs: int) -> tuple[float, float]:
    """Used memory's growth per job since `fresh` began, and the same less the event stream's."""
    growth = await used_memory(fresh.redis) - fresh.before_bytes
    stream_growth = await events_bytes(fresh.redis, fresh.namespace) - fresh.before_events_bytes
    return growth / jobs, (growth - stream_growth) / jobs


@contextlib.asynccontextmanager
async def fresh_redis() -> AsyncIterator[Fresh]:
    server = RedisServer()
    redis = Redis.from_url(server.url)
    try:
        namespace = f"scale-{uuid.uuid4().hex[:8]}"
        async with Agent(AgentSettings(redis_url=server.url, namespace=namespace)) as agent:
            client = ClientAgent(agent)
            await client.enqueue_many([Noop()], "bench")  # loads the scripts
            yield Fresh(server.url, redis, namespace, client, await used_memory(redis),
                        await events_bytes(redis, namespace))
    finally:
        await redis.aclose()
        server.stop()


async def at_backlog(backlog: int, window_s: float) -> dict[str, float]:
    async with fresh_redis() as fresh:
        await enqueue_all(fresh.client, backlog, defer_s=BACKLOG_DEFER_S)
        queued_job_bytes, queued_job_bytes_without_events = await grown(fresh, backlog)
        enqueue_per_s = await enqueue_all(fresh.client, MEASURED_JOBS)
        drain_per_s = drain_rate(fresh.namespace, fresh.url, window_s)
    return {"enqueue_per_s": round(enqueue_per_s), "drain_per_s": round(drain_per_s),
            "queued_job_bytes": round(queued_job_bytes),
            "queued_job_bytes_without_events": round(queued_job_bytes_without_events)}


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
        state_bytes, state_bytes_without_events = await grown(fresh, retained)
        enqueue_per_s = await enqueue_all(fresh.client, MEASURED_JOBS)
        drain_per_s = drain_rate(fresh.namespace, fresh.url, window_s)
    return {"enqueue_per_s": round(enqueue_per_s), "drain_per_s": round(drain_per_s),
            "finished_state_bytes": round(state_bytes),
            "finished_state_bytes_without_events": round(state_bytes_without_events)}


async def finished_state_bytes() -> float:
    async with fresh_redis() as fresh:
        await enqueue_all(fresh.client, FINISHED_JOBS)
        proc = spawn_worker("agent", fresh.namespace, fresh.url, burst=True)
        proc.communicate(timeout=600)
        return (await grown(fresh, FINISHED_JOBS))[0]


async def warm_up() -> None:
    """One unrecorded round, so the first backlog measured does not carry this process's first calls."""
    async with fresh_redis() as fresh:
        await enqueue_all(fresh.client, MEASURED_JOBS)


async def by_size(
    what: str, measure: Callable[[int, float], Awaitable[dict[str, float]]], sizes: list[int], args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """`measure` at each size, `args.rounds` times, every second round in the reverse order; the
    median of each figure by size."""
    rounds: dict[int, list[dict[str, float]]] = {size: [] for size in sizes}
    for r in range(args.rounds):
        for size in sizes if r % 2 == 0 else reversed(sizes):
            figures = await measure(size, args.window_s)
            rounds[size].append(figures)
            print(f"{what} {size:>9,} (round {r + 1}): {figures}", flush=True)
    return {
        str(size): {k: round(statistics.median(f[k] for f in runs)) for k in runs[0]} for size, runs in rounds.items()
    }


async def main(args: argparse.Namespace) -> None:
    sizes = [1000, 100_000] + ([1_000_000] if args.big else [])
    await warm_up()
    backlogs = await by_size("backlog", at_backlog, sizes, args)
    retained = await by_size("retained", at_retained, sizes, args)
    state_bytes = await finished_state_bytes()
    print(f"finished state: {state_bytes:.0f} bytes per job", flush=True)
    smallest, largest = str(sizes[0]), str(sizes[-1])

    def ratio(figures: dict[str, dict[str, float]], rate: str) -> float:
        return round(figures[largest][rate] / figures[smallest][rate], 3)

    result: dict[str, Any] = {
        "backlogs": backlogs,
        "retained": retained,
        "finished_state_bytes": round(state_bytes),
        "queued_job_bytes_at_100k": backlogs["100000"]["queued_job_bytes"],
        "finished_state_bytes_at_100k": retained["100000"]["finished_state_bytes"],
        "queued_job_bytes_without_events_at_largest": backlogs[largest]["queued_job_bytes_without_events"],
        "finished_state_bytes_without_events_at_largest":
            retained[largest]["finished_state_bytes_without_events"],
        "enqueue_ratio_largest_vs_smallest": ratio(backlogs, "enqueue_per_s"),
        "drain_ratio_largest_vs_smallest": ratio(backlogs, "drain_per_s"),
        "retained_enqueue_ratio_largest_vs_smallest": ratio(retained, "enqueue_per_s"),
        "retained_drain_ratio_largest_vs_smallest": ratio(retained, "drain_per_s"),
        "window_s": args.window_s,
        "rounds": args.rounds,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="also 1,000,000 queued jobs, and retained (minutes, GBs)")
    parser.add_argument("--window-s", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=1, help="every size this many times, every second round reversed")
    asyncio.run(main(parser.parse_args()))
