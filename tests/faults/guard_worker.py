"""A process hammering one guarded connection, for tests/faults/test_guard_processes.py.

`python -m tests.faults.guard_worker REDIS_URL NAMESPACE NAME ACQUISITIONS INTERVAL_S TASKS`: the
library used directly (no arq worker). It says it is ready, waits for the go (so every process
contends at once), then makes ACQUISITIONS requests from TASKS concurrent tasks, as fast as the
guard lets it; each records Redis's TIME on entry and the slot it was given (microseconds), pushed
as JSON [start, slot, pid] to `<namespace>:guard-test:entries` when all are done.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from redis.asyncio import Redis

from agent_async import ConnectionGuard, GuardConfig


async def main(redis_url: str, namespace: str, name: str, acquisitions: int, interval_s: float, tasks: int) -> None:
    redis = Redis.from_url(redis_url)
    guard = ConnectionGuard(redis, namespace=namespace, default=GuardConfig(min_interval_s=interval_s))
    entries: list[tuple[int, int]] = []
    left = [acquisitions]

    async def hammer() -> None:
        while left[0] > 0:
            left[0] -= 1
            async with guard.request(name) as permit:
                seconds, micros = await redis.time()
                entries.append((int(seconds) * 1_000_000 + int(micros), permit.slot_us))

    try:
        await redis.rpush(f"{namespace}:guard-test:ready", "1")
        if await redis.blpop([f"{namespace}:guard-test:go"], timeout=30) is None:
            raise SystemExit("no go within 30 s")
        await asyncio.gather(*(hammer() for _ in range(tasks)))
        await redis.rpush(f"{namespace}:guard-test:entries", *(json.dumps([*e, os.getpid()]) for e in entries))
    finally:
        await redis.aclose()


if __name__ == "__main__":
    url, ns, conn, n, interval, concurrency = sys.argv[1:7]
    asyncio.run(main(url, ns, conn, int(n), float(interval), int(concurrency)))
