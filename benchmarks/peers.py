"""agent-async against its peers (SAQ, Taskiq, Dramatiq) and arq's CLI worker, in one run.

The fast worker runs twice: with its defaults (`agent_async`, the one the ratios compare; its
finish calls wait up to AGENT_WORKER_FINISH_LINGER_MS=2 for the runs still holding slots) and with
AGENT_WORKER_FINISH_LINGER_MS=0 (`agent_async_no_linger`: each finish call goes as soon as none is
in flight, smaller calls: more jobs/s from one worker, more Redis work per job).

Usage: python benchmarks/peers.py [--quick] [--jobs N] [--reps R] [--samples S] [--idle-s S]

Same job bodies everywhere: one Redis INCR (drain); a sleep of NAP_S then that INCR (the sleep
variant: jobs that wait on I/O); one RPUSH of the time it ran (start latency probe). Each queue
runs one worker process, at 10 jobs at a time (SAQ concurrency, Taskiq max_async_tasks, Dramatiq
worker threads, arq/agent max_jobs), against a fresh redis-server of this script's own per run, so
INFO commandstats and Redis CPU count that queue only. Runs are
interleaved (queue order rotates each repetition) and medians printed. Per run:

- enqueue_per_s: one producer queues N jobs (async clients 200 at a time with gather; Dramatiq's
  client is synchronous: one send after the other);
- drain_per_s: the backlog, drained by a worker started after it, between the first and the last
  job seen done (the INCR counter read with GETRANGE, a command no queue uses);
- drain_sleep_per_s: the sleep variant, N/5 jobs queued to the running worker at once, measured
  the same way; at 10 jobs at a time its ceiling is 10 / NAP_S (1,000 jobs/s): what a queue
  falls short of it is its own cost per job while its jobs wait. `bare_asyncio_sleep_per_s` is
  the bare dependency's ceiling on this machine: 10 coroutines doing the same body in a loop, no
  queue (asyncio's timers alone overshoot a 10 ms sleep);
- redis_cmds_per_job, redis_cpu_us_per_job: enqueue plus drain, per job (Lua-internal calls
  counted; INFO and the counter reads left out);
- worker_cpu_us_per_job: the worker process's CPU time over the drain window, per job;
- start_p50_ms / start_p99_ms: enqueue to body on an idle worker, one job at a time;
- idle_cmds_per_s: Redis commands per second of an idle worker, over `--idle-s` (30 s: whole
  cycles of the periodic work every queue does, the fast worker's recovery pass every 5 s, its
  directory beat and longest block every 10 s and its sweeps every 15 s among it; 2 s with
  --quick, which mostly misses it).

Ratios compare agent-async's fast worker with the best of SAQ, Taskiq and Dramatiq:
`drain_vs_best_peer` and `enqueue_vs_best_peer` (higher is better) and `start_p50_vs_best_peer`
(its p50 over the lowest peer p50: lower is better), `drain_sleep_vs_best_peer`, and
`drain_sleep_vs_bare_asyncio`. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import psutil
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_async import Agent, AgentSettings, ClientAgent, Job, JobRequest, agent_job

COUNTER = "bench:count"
# The sleep variant's wait: a job that waits 10 ms on I/O, 10 at a time, caps a worker at 1,000 jobs/s.
NAP_S = 0.010
PROBE = "bench:probe"
CONCURRENCY = 10
PEERS = ("saq", "taskiq", "dramatiq")
QUEUES = ("agent_async", "agent_async_no_linger", "agent_async_arq_cli", *PEERS)
NAMESPACE = "peers"
# Commands the driver itself sends while it measures, not counted against the queue.
_DRIVER_COMMANDS = frozenset({"info", "getrange"})


# -- the job bodies, for each queue ----------------------------------------------------------------

_BODY_REDIS: dict[str, Redis] = {}


def body_redis(url: str) -> Redis:
    if url not in _BODY_REDIS:
        _BODY_REDIS[url] = Redis.from_url(url)
    return _BODY_REDIS[url]


@dataclass
class Incr(JobRequest):
    name: ClassVar[str] = "bench.incr"


@dataclass
class Nap(JobRequest):
    name: ClassVar[str] = "bench.nap"


@dataclass
class Probe(JobRequest):
    name: ClassVar[str] = "bench.probe"


@agent_job
class IncrJob(Job[Incr]):
    request_class = Incr

    async def process(self, request: Incr, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await self.resources.redis.incr(COUNTER)
        return {}


@agent_job
class NapJob(Job[Nap]):
    request_class = Nap

    async def process(self, request: Nap, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await asyncio.sleep(NAP_S)
        await self.resources.redis.incr(COUNTER)
        return {}


@agent_job
class ProbeJob(Job[Probe]):
    request_class = Probe

    async def process(self, request: Probe, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
        await self.resources.redis.rpush(PROBE, repr(time.time()))
        return {}


class System:
    """One queue: how to enqueue the two jobs from the driver, and how to run its worker."""

    name: ClassVar[str]

    def __init__(self, url: str) -> None:
        self.url = url

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def enqueue_incr(self, n: int) -> None:
        raise NotImplementedError

    async def enqueue_nap(self, n: int) -> None:
        raise NotImplementedError

    async def enqueue_probe(self) -> None:
        raise NotImplementedError

    async def serve(self) -> None:
        """Worker process side: run until SIGTERM."""
        raise NotImplementedError


async def gather_in_chunks(n: int, make: Callable[[], Awaitable[Any]], chunk: int = 200) -> None:
    for start in range(0, n, chunk):
        await asyncio.gather(*(make() for _ in range(start, min(n, start + chunk))))


class AgentSystem(System):
    name = "agent_async"
    stock = False
    # AGENT_WORKER_FINISH_LINGER_MS (None: the default)
    linger_ms: float | None = None

    async def open(self) -> None:
        self.agent = Agent(AgentSettings(redis_url=self.url, namespace=NAMESPACE))
        await self.agent.open()
        self.client = ClientAgent(self.agent)

    async def close(self) -> None:
        await self.agent.close()

    async def enqueue_incr(self, n: int) -> None:
        await gather_in_chunks(n, lambda: self.client.enqueue(Incr()))

    async def enqueue_nap(self, n: int) -> None:
        await gather_in_chunks(n, lambda: self.client.enqueue(Nap()))

    async def enqueue_many(self, n: int) -> None:
        for start in range(0, n, 500):
            await self.client.enqueue_many([Incr() for _ in range(start, min(n, start + 500))])

    async def enqueue_probe(self) -> None:
        await self.client.enqueue(Probe())

    async def serve(self) -> None:
        linger = {} if self.linger_ms is None else {"worker_finish_linger_ms": self.linger_ms}
        agent = Agent(AgentSettings(redis_url=self.url, namespace=NAMESPACE, worker_max_jobs=CONCURRENCY, **linger))
        try:
            await agent.run_worker(handle_signals=True, stock_worker=self.stock)
        finally:
            await agent.close()


class AgentNoLingerSystem(AgentSystem):
    name = "agent_async_no_linger"
    linger_ms = 0.0


class AgentCliSystem(AgentSystem):
    name = "agent_async_arq_cli"
    stock = True


class SaqSystem(System):
    name = "saq"

    async def open(self) -> None:
        from saq import Queue

        self.queue = Queue.from_url(self.url)
        await self.queue.connect()

    async def close(self) -> None:
        await self.queue.disconnect()

    async def enqueue_incr(self, n: int) -> None:
        await gather_in_chunks(n, lambda: self.queue.enqueue("incr"))

    async def enqueue_nap(self, n: int) -> None:
        await gather_in_chunks(n, lambda: self.queue.enqueue("nap"))

    async def enqueue_probe(self) -> None:
        await self.queue.enqueue("probe")

    async def serve(self) -> None:
        from saq import Queue, Worker

        redis = body_redis(self.url)

        async def incr(ctx: Any) -> None:
            await redis.incr(COUNTER)

        async def nap(ctx: Any) -> None:
            await asyncio.sleep(NAP_S)
            await redis.incr(COUNTER)

        async def probe(ctx: Any) -> None:
            await redis.rpush(PROBE, repr(time.time()))

        queue = Queue.from_url(self.url)
        functions = [("incr", incr), ("nap", nap), ("probe", probe)]
        worker = Worker(queue, functions=functions, concurrency=CONCURRENCY)
        await run_until_sigterm(worker.start(), worker.stop)


class TaskiqSystem(System):
    name = "taskiq"

    def _broker(self) -> Any:
        from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

        broker = RedisStreamBroker(self.url).with_result_backend(RedisAsyncResultBackend(self.url))
        redis = body_redis(self.url)

        async def incr() -> None:
            await redis.incr(COUNTER)

        async def nap() -> None:
            await asyncio.sleep(NAP_S)
            await redis.incr(COUNTER)

        async def probe() -> None:
            await redis.rpush(PROBE, repr(time.time()))

        self.incr = broker.register_task(incr, task_name="incr")
        self.nap = broker.register_task(nap, task_name="nap")
        self.probe = broker.register_task(probe, task_name="probe")
        return broker

    async def open(self) -> None:
        self.broker = self._broker()
        await self.broker.startup()

    async def close(self) -> None:
        await self.broker.shutdown()

    async def enqueue_incr(self, n: int) -> None:
        await gather_in_chunks(n, self.incr.kiq)

    async def enqueue_nap(self, n: int) -> None:
        await gather_in_chunks(n, self.nap.kiq)

    async def enqueue_probe(self) -> None:
        await self.probe.kiq()

    async def serve(self) -> None:
        from taskiq.api import run_receiver_task

        broker = self._broker()
        broker.is_worker_process = True
        await broker.startup()
        try:
            await run_until_sigterm(run_receiver_task(broker, max_async_tasks=CONCURRENCY), None)
        finally:
            await broker.shutdown()


class DramatiqSystem(System):
    name = "dramatiq"

    def _actors(self) -> Any:
        import dramatiq
        import redis as sync_redis
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=self.url)
        dramatiq.set_broker(broker)
        client = sync_redis.Redis.from_url(self.url)

        def incr() -> None:
            client.incr(COUNTER)

        def nap() -> None:
            time.sleep(NAP_S)  # a worker thread's wait
            client.incr(COUNTER)

        def probe() -> None:
            client.rpush(PROBE, repr(time.time()))

        self.incr = dramatiq.actor(incr, actor_name="incr", max_retries=0)
        self.nap = dramatiq.actor(nap, actor_name="nap", max_retries=0)
        self.probe = dramatiq.actor(probe, actor_name="probe", max_retries=0)
        return broker

    async def open(self) -> None:
        self.broker = self._actors()

    async def close(self) -> None:
        self.broker.close()

    async def enqueue_incr(self, n: int) -> None:
        for _ in range(n):
            self.incr.send()

    async def enqueue_nap(self, n: int) -> None:
        for _ in range(n):
            self.nap.send()

    async def enqueue_probe(self) -> None:
        self.probe.send()

    async def serve(self) -> None:
        from dramatiq import Worker

        broker = self._actors()
        worker = Worker(broker, worker_threads=CONCURRENCY)
        worker.start()
        try:
            await run_until_sigterm(asyncio.Event().wait(), None)
        finally:
            worker.stop()
            broker.close()


SYSTEMS: dict[str, type[System]] = {
    s.name: s for s in (AgentSystem, AgentNoLingerSystem, AgentCliSystem, SaqSystem, TaskiqSystem, DramatiqSystem)
}


async def run_until_sigterm(main: Awaitable[Any], stop: Callable[[], Awaitable[Any]] | None) -> None:
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopped.set)
    task = asyncio.ensure_future(main)
    await asyncio.wait([task, asyncio.ensure_future(stopped.wait())], return_when=asyncio.FIRST_COMPLETED)
    if stop is not None:
        with contextlib.suppress(Exception):
            await stop()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


# -- a private redis-server per run ----------------------------------------------------------------

class RedisServer:
    """A redis-server of this script's own; `wrapper` runs it under another command (valgrind)."""

    def __init__(self, wrapper: tuple[str, ...] = ()) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.dir = tempfile.mkdtemp(prefix="peers-redis-")
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed")
        self.proc = subprocess.Popen(
            [*wrapper, binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + (60 if wrapper else 10)
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Snapshot:
    commands: int
    redis_cpu_s: float
    at: float


async def snapshot(redis: Redis) -> Snapshot:
    stats = await redis.info("commandstats")
    cpu = await redis.info("cpu")
    commands = sum(int(v["calls"]) for k, v in stats.items() if k.removeprefix("cmdstat_") not in _DRIVER_COMMANDS)
    return Snapshot(commands, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), time.perf_counter())


def spawn(name: str, url: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, __file__, "--worker", name, "--redis-url", url],
                                stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    total = times.user + times.system
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
    return float(total)


async def counter(redis: Redis) -> int:
    raw = await redis.getrange(COUNTER, 0, -1)
    return int(raw) if raw else 0


async def count_reaches(
    redis: Redis, n: int, deadline: float, failure: str, *, alive: Callable[[], bool] = lambda: True
) -> int:
    """Poll the jobs' counter every 2 ms until it reaches n, and return it; RuntimeError(failure)
    past the deadline (time.monotonic) or once the worker is not `alive`."""
    while (seen := await counter(redis)) < n:
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(failure)
        await asyncio.sleep(0.002)
    return seen


async def one_run(name: str, args: argparse.Namespace, log: Path) -> dict[str, float]:
    server = RedisServer()
    redis = Redis.from_url(server.url)
    system = SYSTEMS[name](server.url)
    n = args.jobs
    try:
        await system.open()
        await system.enqueue_probe()  # a warm-up: connections and scripts, not counted
        await redis.delete(COUNTER)
        before = await snapshot(redis)
        t0 = time.perf_counter()
        await system.enqueue_incr(n)
        enqueue_s = time.perf_counter() - t0
        enqueued = await snapshot(redis)
        proc = spawn(name, server.url, log)
        try:
            ps = psutil.Process(proc.pid)
            deadline = time.monotonic() + 300
            first_seen = await count_reaches(redis, 1, deadline, f"{name}: no job ran (see {log})",
                                             alive=lambda: proc.poll() is None)
            first, first_cpu = await snapshot(redis), cpu_s(ps)
            await count_reaches(redis, n, deadline, f"{name}: not all {n} jobs ran in 300 s")
            last, last_cpu = await snapshot(redis), cpu_s(ps)
            drained = n - first_seen
            figures = {
                "enqueue_per_s": n / enqueue_s,
                "drain_per_s": drained / (last.at - first.at) if drained else 0.0,
                "redis_cmds_per_job": (enqueued.commands - before.commands) / n
                + (last.commands - first.commands) / max(1, drained),
                "redis_cpu_us_per_job": 1e6 * ((enqueued.redis_cpu_s - before.redis_cpu_s) / n
                                               + (last.redis_cpu_s - first.redis_cpu_s) / max(1, drained)),
                "worker_cpu_us_per_job": 1e6 * (last_cpu - first_cpu) / max(1, drained),
            }
            figures.update(await start_latency(system, redis, args.samples))
            await asyncio.sleep(0.5)
            idle_before = await snapshot(redis)
            await asyncio.sleep(args.idle_s)
            idle_after = await snapshot(redis)
            figures["idle_cmds_per_s"] = (idle_after.commands - idle_before.commands) / (idle_after.at - idle_before.at)
            figures["drain_sleep_per_s"] = await nap_rate(system, redis, max(200, n // 5))
            if isinstance(system, AgentSystem) and not system.stock:
                await redis.delete(COUNTER)
                t0 = time.perf_counter()
                await system.enqueue_many(n)
                figures["enqueue_many_per_s"] = n / (time.perf_counter() - t0)
        finally:
            stop(proc)
    finally:
        with contextlib.suppress(Exception):
            await system.close()
        await redis.aclose()
        server.stop()
    return figures


async def nap_rate(system: System, redis: Redis, n: int) -> float:
    """Jobs/s of the sleep variant: n jobs queued to the running (idle) worker, between the first
    and the last seen done."""
    await redis.delete(COUNTER)
    enqueue = asyncio.ensure_future(system.enqueue_nap(n))
    deadline = time.monotonic() + 300
    first_seen = await count_reaches(redis, 1, deadline, f"{system.name}: no sleep job ran")
    first_at = time.perf_counter()
    await count_reaches(redis, n, deadline, f"{system.name}: not all {n} sleep jobs ran in 300 s")
    await enqueue
    return (n - first_seen) / (time.perf_counter() - first_at)


async def bare_asyncio_sleep_rate(n: int) -> float:
    """The sleep variant's body run by 10 plain coroutines, each in a loop, on a fresh Redis."""
    server = RedisServer()
    redis = Redis.from_url(server.url)
    left = n

    async def slot() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await asyncio.sleep(NAP_S)
            await redis.incr(COUNTER)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(slot() for _ in range(CONCURRENCY)))
        return n / (time.perf_counter() - started)
    finally:
        await redis.aclose()
        server.stop()


async def start_latency(system: System, redis: Redis, samples: int) -> dict[str, float]:
    await redis.delete(PROBE)
    rng = random.Random(0)
    latencies = []
    for _ in range(samples):
        # Let the worker go idle; a random pause so samples do not lock onto a poll phase.
        await asyncio.sleep(rng.uniform(0.02, 0.03))
        t0 = time.time()
        await system.enqueue_probe()
        reply = await redis.blpop([PROBE], timeout=10)
        if reply is None:
            raise RuntimeError(f"{system.name}: a probe did not run within 10 s")
        latencies.append((float(reply[1]) - t0) * 1000)
    return {"start_p50_ms": percentile(latencies, 50), "start_p99_ms": percentile(latencies, 99)}


def percentile(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def available(name: str) -> str | None:
    """Why a queue cannot run here, or None."""
    modules = {"saq": ["saq"], "taskiq": ["taskiq", "taskiq_redis"], "dramatiq": ["dramatiq"]}.get(name, [])
    for module in modules:
        try:
            __import__(module)
        except ImportError as exc:
            return f"not installed ({exc}); pip install -e '.[bench]'"
    return None


async def main(args: argparse.Namespace) -> None:
    skipped = {name: why for name in QUEUES if (why := available(name))}
    queues = [name for name in QUEUES if name not in skipped]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in queues}
    bare: list[float] = []
    log = Path(tempfile.gettempdir()) / f"peers-{uuid.uuid4().hex[:6]}.log"
    for rep in range(args.reps):
        order = queues[rep % len(queues):] + queues[:rep % len(queues)]
        bare.append(await bare_asyncio_sleep_rate(max(200, args.jobs // 5)))
        print(f"rep {rep + 1} bare asyncio sleep body: {bare[-1]:.1f} jobs/s", flush=True)
        for name in order:
            figures = await one_run(name, args, log)
            runs[name].append(figures)
            print(f"rep {rep + 1} {name:20s} " + " ".join(f"{k}={v:.1f}" for k, v in figures.items()), flush=True)
    medians = {name: {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]} for name, rs in runs.items()}
    peers = [medians[p] for p in PEERS if p in medians]
    ours = medians.get("agent_async")
    ratios: dict[str, float] = {}
    if ours and peers:
        ratios = {
            "drain_vs_best_peer": round(ours["drain_per_s"] / max(p["drain_per_s"] for p in peers), 3),
            "enqueue_vs_best_peer": round(ours["enqueue_per_s"] / max(p["enqueue_per_s"] for p in peers), 3),
            "start_p50_vs_best_peer": round(ours["start_p50_ms"] / min(p["start_p50_ms"] for p in peers), 3),
            "drain_sleep_vs_best_peer": round(
                ours["drain_sleep_per_s"] / max(p["drain_sleep_per_s"] for p in peers), 3
            ),
            "drain_sleep_vs_bare_asyncio": round(ours["drain_sleep_per_s"] / statistics.median(bare), 3),
        }
    print(json.dumps({"jobs": args.jobs, "reps": args.reps, "samples": args.samples, "idle_s": args.idle_s,
                      "concurrency": CONCURRENCY,
                      "bare_asyncio_sleep_per_s": round(statistics.median(bare), 2), "queues": medians,
                      **ratios, "skipped": skipped}))


def worker(name: str, url: str) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(SYSTEMS[name](url).serve())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 2 repetitions, 30 latency samples")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--reps", type=int)
    parser.add_argument("--samples", type=int)
    parser.add_argument("--idle-s", type=float, help="the idle window (default 30 s; 2 s with --quick)")
    parser.add_argument("--worker", choices=sorted(SYSTEMS))
    parser.add_argument("--redis-url", default=os.environ.get("AGENT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    cli = parser.parse_args()
    if cli.worker:
        worker(cli.worker, cli.redis_url)
    else:
        cli.jobs = cli.jobs or (2000 if cli.quick else 10_000)
        cli.reps = cli.reps or (2 if cli.quick else 3)
        cli.samples = cli.samples or (30 if cli.quick else 100)
        cli.idle_s = cli.idle_s or (2.0 if cli.quick else 30.0)
        asyncio.run(main(cli))
