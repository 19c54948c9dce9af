"""ConnectionGuard pacing across real processes: two worker processes, one guarded name, one Redis.

The processes (tests/faults/guard_worker.py) use the library directly: no arq worker is needed to
share a guard, only the namespace and Redis. Starts are judged on Redis's clock (TIME at entry),
the one clock both processes share.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys

import pytest
from redis.asyncio import Redis

from tests.conftest import REDIS_URL
from tests.faults.conftest import FIGURES, ROOT
from tests.test_guard import pacing_figures

pytestmark = pytest.mark.slow

PROCESSES = 2
ACQUISITIONS = 40  # per process
TASKS = 4  # concurrent callers in each process
INTERVAL_S = 0.02


async def test_two_processes_never_start_closer_than_the_interval(redis: Redis, namespace: str) -> None:
    name = "ics:shared.example.org"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.faults.guard_worker",
            REDIS_URL, namespace, name, str(ACQUISITIONS), str(INTERVAL_S), str(TASKS),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for _ in procs:
            assert await redis.blpop([f"{namespace}:guard-test:ready"], timeout=30), "a worker did not start"
        await redis.rpush(f"{namespace}:guard-test:go", *["go"] * PROCESSES)
        outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), timeout=60)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    for proc, (out, _) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out.decode()

    raw = [json.loads(item) for item in await redis.lrange(f"{namespace}:guard-test:entries", 0, -1)]
    assert len(raw) == PROCESSES * ACQUISITIONS
    figures = pacing_figures([(start, slot) for start, slot, _ in raw], INTERVAL_S)
    # Contended for real: the processes' slots interleave, they did not take turns one run each.
    by_slot = [pid for _, _, pid in sorted(raw, key=lambda entry: entry[1])]
    switches = sum(1 for a, b in itertools.pairwise(by_slot) if a != b)
    assert switches >= 10, f"only {switches} hand-overs between processes"
    FIGURES["guard_pacing"] = {"processes": PROCESSES, "hand_overs": switches, **figures}
