"""Where one start goes on an idle fast worker: the producer's enqueue, the wake-up, then each step
of the worker from the claim's reply to `process()`.

A worker process (peers.py's agent_async worker, on a private redis-server) gets time stamps
patched around its steps; the driver enqueues one probe at a time, 20-30 ms apart, and reads the
stamps back. Prints the median of each stage in ms (the time since the stage before) and, as its
last line, one JSON object. Redis's own time for the scripts on that path comes from SLOWLOG.

    python benchmarks/start_breakdown.py [--samples 300]

To measure an older checkout: `python <checkout>/benchmarks/start_breakdown.py` (it puts its own
checkout first on the path, as peers.py does).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # puts this checkout first on the path
from redis.asyncio import Redis

STAMPS = "bench:start-stamps"
# The worker's steps, in order: each stage is the time since the one before it.
STAGES = ("woken", "run_job", "on_job_start", "job_function", "process")


def worker(url: str) -> None:
    """The peers worker with a time stamp at each step; the probe body pushes them to the driver."""
    from agent_async.engine import hooks, wakeup
    from agent_async.engine import worker as engine_worker
    from agent_async.worker import runner

    marks: dict[str, float] = {}

    def stamped(name: str, coroutine_function: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            marks[name] = time.time()
            return await coroutine_function(*args, **kwargs)
        return wrapper

    wait = wakeup.Waker.wait

    async def stamped_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        woken = await wait(self, *args, **kwargs)
        marks["woken"] = time.time()
        return woken

    wakeup.Waker.wait = stamped_wait  # type: ignore[method-assign]
    engine_worker.FastWorker.run_job = stamped("run_job", engine_worker.FastWorker.run_job)  # type: ignore[method-assign]
    hooks.Hooks.on_job_start = stamped("on_job_start", hooks.Hooks.on_job_start)  # type: ignore[method-assign]
    job_entry = hooks.Hooks.job_entry
    hooks.Hooks.job_entry = lambda self, name: stamped("job_function", job_entry(self, name))  # type: ignore[method-assign]
    runner.JobRunner._process = stamped("process", runner.JobRunner._process)  # type: ignore[method-assign]
    probe = peers.ProbeJob.process

    async def process(self: Any, request: Any, *, user_uid: str | None, job_id: str) -> Any:
        body_s = time.time()
        await self.resources.redis.rpush(STAMPS, json.dumps({**marks, "body": body_s}))
        return await probe(self, request, user_uid=user_uid, job_id=job_id)

    peers.ProbeJob.process = process  # type: ignore[method-assign]
    peers.worker("agent_async", url)


def spawn(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--worker", "--redis-url", url])


async def measure(samples: int) -> dict[str, Any]:
    server = peers.RedisServer()
    proc = None
    try:
        redis = Redis.from_url(server.url)
        proc = spawn(server.url)
        system = peers.AgentSystem(server.url)
        await system.open()
        await asyncio.sleep(2.0)  # the worker is up and idle
        await redis.config_set("slowlog-log-slower-than", 0)
        await redis.config_set("slowlog-max-len", 100_000)
        await redis.slowlog_reset()
        rng = random.Random(0)
        rows = []
        for _ in range(samples):
            await asyncio.sleep(rng.uniform(0.02, 0.03))
            t0 = time.time()
            await system.enqueue_probe()
            enqueued = time.time()
            reply = await redis.blpop([STAMPS], timeout=10)
            if reply is None:
                raise RuntimeError("a probe did not run within 10 s")
            marks = json.loads(reply[1])
            row = {"enqueue_call": enqueued - t0, "woken": marks["woken"] - t0}
            for before, stage in itertools.pairwise(STAGES):
                row[stage] = marks[stage] - marks[before]
            row["body"] = marks["body"] - marks["process"]
            row["total"] = marks["body"] - t0
            row["worker_part"] = marks["body"] - marks["woken"]
            rows.append(row)
        slow = await redis.slowlog_get(100_000)
        await system.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
        server.stop()
    rows = rows[5:]  # the first probes warm the scripts
    figures = {key: round(statistics.median(row[key] for row in rows) * 1000, 3) for key in rows[0]}
    totals = sorted(row["total"] for row in rows)
    figures["total_p99"] = round(totals[int(len(totals) * 0.99)] * 1000, 3)
    # Scripts by SHA: the ones run once per probe are the enqueue, the claim and the finish.
    scripts: dict[str, list[int]] = {}
    for entry in slow:
        args = entry["command"].split()
        if args[0].lower() == b"evalsha":
            scripts.setdefault(args[1].decode()[:8], []).append(int(entry["duration"]))
    figures["script_us"] = sorted(
        (round(statistics.median(durations)) for durations in scripts.values() if len(durations) >= samples // 2),
        reverse=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.redis_url)
        return
    figures = asyncio.run(measure(args.samples))
    for key, value in figures.items():
        print(f"{key:14s} {value}")
    print(json.dumps({"samples": args.samples, **figures}))


if __name__ == "__main__":
    main()
