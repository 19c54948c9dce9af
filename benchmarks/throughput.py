"""Throughput and latency of agent_async against bare arq, same Redis, same arq settings.

Usage: python benchmarks/throughput.py [--jobs N] [--redis-url URL]

Both sides: one worker process, JSON serializer, poll_delay/max_jobs from AgentSettings defaults,
keep_result=0, arq logging at WARNING. agent_async is measured twice: with its own worker
(`Agent.run_worker`, `python -m app worker`; "ratio") and under arq's stock Worker
(`arq app.worker.WorkerSettings`; "ratio_arq_cli_worker"). The backlog of N no-op jobs is queued
first, then a worker drains it in burst mode; jobs/s is measured inside the worker process
between its first and its last run, so neither side's start-up counts. The last line printed is
one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

# This checkout first (its worker subprocesses too, started from this file), not the installed one.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.worker import Worker, func
from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, Job, JobRequest, agent_job
from agent_async.engine.wire import wire_dumps, wire_loads

BASE = AgentSettings()
ARQ_SETTINGS: dict[str, Any] = {
    "poll_delay": BASE.poll_delay_s,
    "max_jobs": BASE.worker_max_jobs,
    "keep_result": 0,
    "job_serializer": wire_dumps,
    "job_deserializer": wire_loads,
    "handle_signals": False,
}
SIGNAL_LIST = "bench:started"

# perf_counter of the first and the last no-op run in this worker process: throughput is measured
# between them, so neither side's start-up (pool, scripts, start-up recovery pass) is counted.
_RUNS: list[float] = []


@dataclass
class Noop(JobRequest):
    name: ClassVar[str] = "bench.noop"


@dataclass
class NoopGated(JobRequest):
    name: ClassVar[str] = "bench.noop_gated"
    max_concurrent: ClassVar[int] = 1_000_000


@dataclass
class Ping(JobRequest):
    name: ClassVar[str] = "bench.ping"


@agent_job
class NoopJob(Job[Noop]):
    request_class = Noop

    async def process(self, request: Noop, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        _RUNS.append(time.perf_counter())
        return {}


@agent_job
class NoopGatedJob(Job[NoopGated]):
    """Only enqueued (the enqueue latency with a gate); registered so that the start-latency
    worker, which finds them queued, runs them as no-ops instead of failing them as unknown."""

    request_class = NoopGated

    async def process(self, request: NoopGated, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        return {}


@agent_job
class PingJob(Job[Ping]):
    request_class = Ping

    async def process(self, request: Ping, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await self.resources.redis.rpush(SIGNAL_LIST + ":" + self.resources.namespace, repr(time.time()))
        return {}


async def bare_noop(ctx: dict[str, Any]) -> None:
    _RUNS.append(time.perf_counter())


async def bare_ping(ctx: dict[str, Any]) -> None:
    await ctx["redis"].rpush(SIGNAL_LIST + ":" + ctx["bench_ns"], repr(time.time()))


# -- worker side (run in a subprocess) -------------------------------------------------------------

async def worker_main(kind: str, namespace: str, redis_url: str, burst: bool) -> None:
    logging.basicConfig(level=logging.WARNING)
    if kind == "arq":
        worker = Worker(
            functions=[func(bare_noop, name="noop"), func(bare_ping, name="ping")],
            queue_name=f"{namespace}:queue",
            redis_settings=RedisSettings.from_dsn(redis_url),
            burst=burst,
            ctx={"bench_ns": namespace},
            **ARQ_SETTINGS,
        )
        await worker.main()
        await worker.close()
    elif kind == "agent_arq_cli":
        # What `arq app.worker.WorkerSettings` runs: arq's own Worker with the agent's settings.
        agent = Agent(AgentSettings(redis_url=redis_url, namespace=namespace))
        worker = Worker(**agent.worker_settings(burst=burst, handle_signals=False))
        await worker.main()
        await worker.close()
    else:
        # agent_one_tx: the fast worker with group commit off, one finish call per run.
        agent = Agent(AgentSettings(redis_url=redis_url, namespace=namespace, worker_coalesce=kind == "agent"))
        await agent.run_worker(burst=burst)  # poll_delay and max_jobs: the same defaults as above
    # From the first run to the last: the time to run len(_RUNS) - 1 more jobs.
    print(json.dumps({"elapsed_s": _RUNS[-1] - _RUNS[0] if len(_RUNS) > 1 else 0.0, "runs": len(_RUNS)}))


def spawn_worker(kind: str, namespace: str, redis_url: str, burst: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", kind, "--namespace", namespace, "--redis-url", redis_url]
        + (["--burst"] if burst else []),
        stdout=subprocess.PIPE, text=True,
    )


# -- driver ----------------------------------------------------------------------------------------

async def commands_processed(redis: Redis) -> int:
    info = await redis.info("stats")
    return int(info["total_commands_processed"])


async def drain(kind: str, namespace: str, redis_url: str, redis: Redis) -> tuple[float, float]:
    before = await commands_processed(redis)
    proc = spawn_worker(kind, namespace, redis_url, burst=True)
    out, _ = proc.communicate(timeout=300)
    figures = json.loads(out.strip().splitlines()[-1])
    # Jobs per second over the runs after the first (see _RUNS): (runs - 1) / elapsed.
    return figures["elapsed_s"] / max(1, figures["runs"] - 1), await commands_processed(redis) - before


async def bare_arq(n: int, redis_url: str, redis: Redis, *, latency: bool) -> dict[str, float]:
    ns = f"bench-arq-{uuid.uuid4().hex[:8]}"
    pool: ArqRedis = await create_pool(
        RedisSettings.from_dsn(redis_url), job_serializer=wire_dumps, job_deserializer=wire_loads,
        default_queue_name=f"{ns}:queue",
    )
    before = await commands_processed(redis)
    for start in range(0, n, 200):
        await asyncio.gather(*(pool.enqueue_job("noop") for _ in range(start, min(n, start + 200))))
    enqueue_cmds = await commands_processed(redis) - before
    per_job_s, run_cmds = await drain("arq", ns, redis_url, redis)
    start_lat = {}
    if latency:
        start_lat = await start_latency(
            "arq", ns, redis_url, redis, lambda: pool.enqueue_job("ping"), samples=100
        )
    await pool.aclose()
    await clean(redis, ns)
    return {"jobs_per_s": 1 / per_job_s, "enqueue_cmds_per_job": enqueue_cmds / n,
            "run_cmds_per_job": run_cmds / n, **start_lat}


async def agent_side(
    n: int, redis_url: str, redis: Redis, *, latency: bool, kind: str = "agent"
) -> dict[str, float]:
    ns = f"bench-agent-{uuid.uuid4().hex[:8]}"
    async with Agent(AgentSettings(redis_url=redis_url, namespace=ns)) as agent:
        client = ClientAgent(agent)
        before = await commands_processed(redis)
        t0 = time.perf_counter()
        for start in range(0, n, 200):
            await asyncio.gather(*(client.enqueue(Noop(), "bench") for _ in range(start, min(n, start + 200))))
        enqueue_per_s = n / (time.perf_counter() - t0)
        enqueue_cmds = await commands_processed(redis) - before
        per_job_s, run_cmds = await drain(kind, ns, redis_url, redis)
        states = await agent.job_store.list_for_user("bench", limit=n)
        succeeded = sum(1 for s in states if s.status == "SUCCESS")
        figures = {"jobs_per_s": 1 / per_job_s, "succeeded": succeeded, "enqueue_per_s": enqueue_per_s,
                   "enqueue_cmds_per_job": enqueue_cmds / n, "run_cmds_per_job": run_cmds / n}
        if kind == "agent":
            figures["enqueue_many_per_s"] = await enqueue_many_rate(n, redis_url, redis)
        if latency:
            # Enqueue latency, gate on: one call at a time.
            samples = []
            for _ in range(500):
                t0 = time.perf_counter()
                await client.enqueue(NoopGated(), "bench-latency")
                samples.append((time.perf_counter() - t0) * 1000)
            figures["enqueue_p50_ms"] = percentile(samples, 50)
            figures["enqueue_p99_ms"] = percentile(samples, 99)
            figures.update(
                await start_latency("agent", ns, redis_url, redis, lambda: client.enqueue(Ping()), samples=100)
            )
    await clean(redis, ns)
    return figures


async def enqueue_many_rate(n: int, redis_url: str, redis: Redis) -> float:
    """Jobs/s queued by one producer through ClientAgent.enqueue_many, 500 per call (its batch)."""
    ns = f"bench-many-{uuid.uuid4().hex[:8]}"
    async with Agent(AgentSettings(redis_url=redis_url, namespace=ns)) as agent:
        client = ClientAgent(agent)
        await client.enqueue_many([Noop()], "bench")  # loads the script: not part of the rate
        t0 = time.perf_counter()
        for start in range(0, n, 500):
            results = await client.enqueue_many([Noop() for _ in range(start, min(n, start + 500))], "bench")
            if not all(r.accepted for r in results):
                raise RuntimeError("enqueue_many refused a job")
        rate = n / (time.perf_counter() - t0)
    await clean(redis, ns)
    return rate


async def clean(redis: Redis, namespace: str) -> None:
    for pattern in (f"{namespace}:*", f"arq:*:{namespace}:*", f"{SIGNAL_LIST}:{namespace}"):
        keys = [k async for k in redis.scan_iter(match=pattern, count=1000)]
        for start in range(0, len(keys), 1000):
            await redis.delete(*keys[start:start + 1000])


async def start_latency(
    kind: str, ns: str, redis_url: str, redis: Redis, enqueue: Any, samples: int
) -> dict[str, float]:
    """From the enqueue call until the job body runs, on an idle worker, one job at a time."""
    proc = spawn_worker(kind, ns, redis_url, burst=False)
    signal_list = f"{SIGNAL_LIST}:{ns}"
    try:
        await enqueue()  # warm-up: the worker is up once this one has run
        await redis.blpop([signal_list], timeout=30)
        latencies = []
        rng = random.Random(0)
        for _ in range(samples):
            # Let the worker go idle; a random pause so samples do not lock onto the poll phase.
            await asyncio.sleep(rng.uniform(0.02, 0.03))
            t0 = time.time()
            await enqueue()
            reply = await redis.blpop([signal_list], timeout=10)
            if reply is None:
                raise RuntimeError(f"{kind}: a job did not start within 10 s")
            latencies.append((float(reply[1]) - t0) * 1000)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"start_latency_p50_ms": percentile(latencies, 50), "start_latency_p99_ms": percentile(latencies, 99)}


def percentile(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1] if pct < 100 else max(values)


async def main(args: argparse.Namespace) -> None:
    redis = Redis.from_url(args.redis_url)
    # Paired rounds, arq then agent, and medians: this machine's noise moves either side by 20%.
    rounds = []
    for i in range(args.rounds):
        last = i == args.rounds - 1
        arq_round = await bare_arq(args.jobs, args.redis_url, redis, latency=last)
        agent_round = await agent_side(args.jobs, args.redis_url, redis, latency=last)
        cli_round = await agent_side(args.jobs, args.redis_url, redis, latency=False, kind="agent_arq_cli")
        one_tx_round = await agent_side(args.jobs, args.redis_url, redis, latency=False, kind="agent_one_tx")
        ratio = agent_round["jobs_per_s"] / arq_round["jobs_per_s"]
        cli_ratio = cli_round["jobs_per_s"] / arq_round["jobs_per_s"]
        print(f"round {i + 1}: bare arq {arq_round['jobs_per_s']:6.0f} jobs/s, agent_async "
              f"{agent_round['jobs_per_s']:6.0f} jobs/s ({agent_round['succeeded']:.0f}/{args.jobs} SUCCESS), "
              f"ratio {ratio:.3f}; under arq's own Worker {cli_round['jobs_per_s']:6.0f} jobs/s "
              f"({cli_round['succeeded']:.0f}/{args.jobs} SUCCESS), ratio {cli_ratio:.3f}; group commit off "
              f"{one_tx_round['jobs_per_s']:6.0f} jobs/s ({one_tx_round['succeeded']:.0f}/{args.jobs} SUCCESS)")
        rounds.append((arq_round, agent_round, ratio, cli_ratio, one_tx_round))
    arq_figures, agent_figures, _, _, one_tx_figures = rounds[-1]
    print(f"bare arq:    start p50 {arq_figures['start_latency_p50_ms']:.2f} ms, "
          f"{arq_figures['enqueue_cmds_per_job']:.1f} enqueue + {arq_figures['run_cmds_per_job']:.1f} run cmds/job")
    print(f"agent_async: start p50 {agent_figures['start_latency_p50_ms']:.2f} ms, "
          f"{agent_figures['enqueue_cmds_per_job']:.1f} enqueue + {agent_figures['run_cmds_per_job']:.1f} run cmds/job "
          "(Lua-internal calls counted)")
    await redis.aclose()
    r2 = lambda v: round(v, 2)  # noqa: E731
    print(json.dumps({
        "jobs": args.jobs,
        "rounds": args.rounds,
        "arq_jobs_per_s": round(statistics.median(r[0]["jobs_per_s"] for r in rounds)),
        "agent_jobs_per_s": round(statistics.median(r[1]["jobs_per_s"] for r in rounds)),
        "ratio": round(statistics.median(r[2] for r in rounds), 3),
        "ratio_per_round": [round(r[2], 3) for r in rounds],
        # The same jobs under `arq app.worker.WorkerSettings` (arq's stock Worker, hooks write the states).
        "ratio_arq_cli_worker": round(statistics.median(r[3] for r in rounds), 3),
        # The fast worker against itself with AGENT_WORKER_COALESCE=false (one finish call per
        # run), paired per round.
        "coalesce_gain": round(statistics.median(r[1]["jobs_per_s"] / r[4]["jobs_per_s"] for r in rounds), 3),
        "agent_one_tx_cmds_per_job": r2(one_tx_figures["enqueue_cmds_per_job"] + one_tx_figures["run_cmds_per_job"]),
        "enqueue_p50_ms": r2(agent_figures["enqueue_p50_ms"]),
        "enqueue_p99_ms": r2(agent_figures["enqueue_p99_ms"]),
        "start_latency_p50_ms": r2(agent_figures["start_latency_p50_ms"]),
        "start_latency_p99_ms": r2(agent_figures["start_latency_p99_ms"]),
        "arq_start_latency_p50_ms": r2(arq_figures["start_latency_p50_ms"]),
        "arq_cmds_per_job": r2(arq_figures["enqueue_cmds_per_job"] + arq_figures["run_cmds_per_job"]),
        "agent_cmds_per_job": r2(agent_figures["enqueue_cmds_per_job"] + agent_figures["run_cmds_per_job"]),
        # One producer: enqueue() 200 at a time with asyncio.gather, then enqueue_many() 500 per call.
        "enqueue_per_s": round(statistics.median(r[1]["enqueue_per_s"] for r in rounds)),
        "enqueue_many_per_s": round(statistics.median(r[1]["enqueue_many_per_s"] for r in rounds)),
        "poll_delay_s": BASE.poll_delay_s,
    }))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default=os.environ.get("AGENT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--worker", choices=["arq", "agent", "agent_arq_cli", "agent_one_tx"])
    parser.add_argument("--namespace")
    parser.add_argument("--burst", action="store_true")
    cli_args = parser.parse_args()
    if cli_args.worker:
        asyncio.run(worker_main(cli_args.worker, cli_args.namespace, cli_args.redis_url, cli_args.burst))
    else:
        asyncio.run(main(cli_args))
