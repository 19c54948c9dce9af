"""Cost of ConnectionGuard against a bare Redis round trip, same client, same run.

Usage: python benchmarks/guard.py [--samples N] [--rounds R] [--redis-url URL]

One uncontended request on a closed circuit without pacing: `async with guard.request(name):`
around nothing, i.e. one acquire script and one release script (two round trips), timed from the
call to the end of the block. The reference is a bare `PING` (one round trip) on the same client,
in paired rounds (PING then guard); medians over rounds, since this machine moves a single figure
by 20% from run to run. "ratio" is guard / PING: about 2 is the floor (two round trips), the rest
is the scripts and the Python around them. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid

from redis.asyncio import Redis

from agent_async import ConnectionGuard, GuardConfig

WARM_UP = 200


def p50_us(samples_s: list[float]) -> float:
    return statistics.median(samples_s) * 1_000_000


async def time_ping(redis: Redis, samples: int) -> float:
    for _ in range(WARM_UP):
        await redis.ping()
    took = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await redis.ping()
        took.append(time.perf_counter() - t0)
    return p50_us(took)


async def time_guard(guard: ConnectionGuard, name: str, samples: int) -> tuple[float, float, float]:
    """p50 of acquire + release, and of each half alone."""
    for _ in range(WARM_UP):  # loads the scripts (first EVALSHA falls back to SCRIPT LOAD)
        async with guard.request(name):
            pass
    whole, enter, leave = [], [], []
    for _ in range(samples):
        t0 = time.perf_counter()
        request = guard.request(name)
        await request.__aenter__()
        t1 = time.perf_counter()
        await request.__aexit__(None, None, None)
        t2 = time.perf_counter()
        whole.append(t2 - t0)
        enter.append(t1 - t0)
        leave.append(t2 - t1)
    return p50_us(whole), p50_us(enter), p50_us(leave)


async def main(args: argparse.Namespace) -> None:
    redis = Redis.from_url(args.redis_url)
    namespace = f"bench-guard-{uuid.uuid4().hex[:8]}"
    guard = ConnectionGuard(redis, namespace=namespace, default=GuardConfig())
    name = "bench:example.org"
    rounds = []
    try:
        for i in range(args.rounds):
            ping = await time_ping(redis, args.samples)
            whole, enter, leave = await time_guard(guard, name, args.samples)
            rounds.append((ping, whole, enter, leave))
            print(f"round {i + 1}: PING p50 {ping:6.1f} us, guard acquire+release p50 {whole:6.1f} us "
                  f"(acquire {enter:.1f}, release {leave:.1f}), ratio {whole / ping:.2f}")
        state = await guard.state(name)
        print(f"after the run: circuit {state.state.value}, {state.failures} failures")
    finally:
        await redis.delete(guard.key(name))
        await redis.aclose()
    med = lambda i: statistics.median(r[i] for r in rounds)  # noqa: E731
    print(json.dumps({
        "samples": args.samples,
        "rounds": args.rounds,
        "ping_us_p50": round(med(0), 1),
        "guard_acquire_us_p50": round(med(1), 1),
        "guard_acquire_only_us_p50": round(med(2), 1),
        "guard_release_only_us_p50": round(med(3), 1),
        "ratio": round(statistics.median(r[1] / r[0] for r in rounds), 2),
        "ratio_per_round": [round(r[1] / r[0], 2) for r in rounds],
        "round_trips_per_request": 2,
    }))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default=os.environ.get("AGENT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    asyncio.run(main(parser.parse_args()))
