"""Where Redis's CPU per job goes: the scripts alone, call by call, and under a real worker.

Usage: python benchmarks/redis_cost.py [--jobs 3000] [--rounds 2] [--mode scripted|worker|both]

Every run gets a private redis-server (benchmarks/peers.py's RedisServer: nothing else runs in it).
Around each phase: CONFIG RESETSTAT, then INFO commandstats and INFO cpu.

`scripted` (the default): one client calls the scripts exactly as the fast worker does, with no
worker around them, so the call pattern is the same at every run: `--jobs` no-op jobs queued by
`enqueue_many` (100 per call), then drained by finish calls of K runs that each claim K more (a
busy worker's finishes: engine/finish.py with its claims), for K = 1, 3 and 10. Per job: Redis CPU
(`cpu_us`, enqueue and drain) and commands (`cmds`, Lua's own calls counted). A worker at 10 slots
draining no-op jobs forms finish calls of about 3 runs. With `--callgrind` the redis-server runs
under valgrind's callgrind, and each phase also reports `ir`, Redis's instructions per job: the
same count for the same calls whatever the machine's load, where its CPU time moves by 20% (run
with --rounds 1: the counts do not vary; valgrind slows Redis about fiftyfold).

`worker`: `--jobs` jobs queued by concurrent `ClientAgent.enqueue` calls (200 at a time, as
throughput.py does), then drained by the fast worker (one process, burst mode). Redis counts a
command a script calls under that command as well as in the script's own time, so:

- `script_us`: EVALSHA's time per job (its commands' time included);
- `commands_us`: every other command's time per job (those the scripts call and those clients send);
- `lua_own_us_at_least`: script_us - commands_us, the scripts' own Lua (argument decoding, the
  library's definitions, redis.call's marshalling) with every other command counted against it;
- `cpu_us`: Redis's process CPU (used_cpu_sys + used_cpu_user) per job: the above plus the network
  I/O and the event loop; `user_us` its user part (the system part is mostly the network's).

Its variants, interleaved over the rounds: `full` (the defaults), `no_events`
(AGENT_EVENTS_ENABLED=false), `no_metrics` (AGENT_METRICS_ENABLED=false), `no_linger`
(AGENT_WORKER_FINISH_LINGER_MS=0). Medians over the rounds; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis.asyncio import Redis

from agent_async import Agent, AgentSettings, ClientAgent, JobStatus
from agent_async.engine.claim import claim_call, claim_in_finish, parse_claim
from agent_async.engine.finish import RunEnd
from agent_async.store import run_script
from benchmarks._util import run_worker_subprocess
from benchmarks.peers import RedisServer
from benchmarks.throughput import Noop

VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},
    "no_events": {"events_enabled": False},
    "no_metrics": {"metrics_enabled": False},
    "no_linger": {"worker_finish_linger_ms": 0.0},
}
SCRIPT_COMMANDS = {"evalsha", "eval", "fcall"}
# Runs per finish call in the scripted drain (each call claims as many jobs as it ends runs).
RUNS_PER_CALL = (1, 3, 10)
ENQUEUE_BATCH = 100
# The commands listed one by one in the readable lines (the rest are summed in `commands_us`).
TOP_COMMANDS = 8
# This script's own calls, not counted.
_OURS = {"config", "info"}


def settings(url: str, namespace: str, variant: str) -> AgentSettings:
    return AgentSettings(redis_url=url, namespace=namespace, **VARIANTS[variant])


async def snapshot(redis: Redis) -> tuple[dict[str, tuple[int, int]], float, float]:
    """Per command (calls, µs) since the last CONFIG RESETSTAT, and Redis's CPU seconds so far
    (user, system)."""
    stats = await redis.info("commandstats")
    cpu = await redis.info("cpu")
    by_command = {name.removeprefix("cmdstat_"): (int(s["calls"]), int(s["usec"])) for name, s in stats.items()}
    return by_command, float(cpu["used_cpu_user"]), float(cpu["used_cpu_sys"])


class Callgrind:
    """Redis's instructions in one phase, counted by valgrind's callgrind in a redis-server started
    under it with instrumentation off (CALLGRIND): on for the phase, then dumped under its name."""

    WRAPPER = ("valgrind", "--tool=callgrind", "--instr-atstart=no")

    def __init__(self, server: RedisServer, out_dir: str) -> None:
        self._pid = str(server.proc.pid)
        self._dir = Path(out_dir)

    @classmethod
    def wrapper(cls, out_dir: str) -> tuple[str, ...]:
        return (*cls.WRAPPER, f"--callgrind-out-file={out_dir}/callgrind.%p")

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, self._pid], check=True, capture_output=True)

    def start(self) -> None:
        self._control("-i", "on")

    def stop(self, name: str) -> int:
        """Instrumentation off; the instructions counted since start()."""
        self._control("-i", "off")
        self._control("-d", name)
        for dump in sorted(self._dir.glob("callgrind.*"), key=lambda p: p.stat().st_mtime, reverse=True):
            text = dump.read_text(errors="replace")
            if f"Trigger: dump {name}" in text:
                return int(next(line for line in text.splitlines() if line.startswith("totals:")).split()[1])
        raise SystemExit(f"no callgrind dump for {name} in {self._dir}")


async def measure(
    redis: Redis, phase: Callable[[], Awaitable[None]], jobs: int, callgrind: Callgrind | None = None
) -> dict[str, Any]:
    """Run `phase()`; Redis's work in it, per job."""
    await redis.config_resetstat()
    _, user_before, sys_before = await snapshot(redis)
    if callgrind:
        callgrind.start()
    await phase()
    ir = callgrind.stop(phase.__name__) if callgrind else None
    by_command, user_after, sys_after = await snapshot(redis)
    by_command = {name: v for name, v in by_command.items() if name.split("|")[0] not in _OURS}
    script_us = sum(us for name, (_, us) in by_command.items() if name in SCRIPT_COMMANDS) / jobs
    commands_us = sum(us for name, (_, us) in by_command.items() if name not in SCRIPT_COMMANDS) / jobs
    top = sorted(by_command.items(), key=lambda item: -item[1][1])[:TOP_COMMANDS]
    return {
        "cpu_us": round(1e6 * (user_after - user_before + sys_after - sys_before) / jobs, 1),
        "user_us": round(1e6 * (user_after - user_before) / jobs, 1),
        "script_us": round(script_us, 1),
        "commands_us": round(commands_us, 1),
        "lua_own_us_at_least": round(script_us - commands_us, 1),
        "calls_per_job": round(sum(calls for calls, _ in by_command.values()) / jobs, 2),
        "top": {name: [round(calls / jobs, 2), round(us / jobs, 1)] for name, (calls, us) in top},
        **({"ir": ir // jobs} if ir is not None else {}),
    }


# -- scripted: the worker's script calls, with no worker -------------------------------------------


class ClaimAsMany:
    """A busy worker's claims with its finishes (engine/finish.py's FinishClaims): as many as the
    runs the call ends."""

    def __init__(self, claim_args: Callable[[int], tuple[int, tuple[str | int, ...]]]) -> None:
        self._claim_args = claim_args
        self.replies: list[Any] = []

    def claim_for(self, runs: Sequence[str]) -> tuple[int, tuple[str | int, ...]]:
        return self._claim_args(len(runs))

    def unanswered(self, claim_args: tuple[str | int, ...]) -> None:
        raise SystemExit("Redis did not answer a finish call")

    def claimed(self, reply: Any, runs: Sequence[str]) -> None:
        self.replies.append(reply)


async def scripted_run(url: str, jobs: int, runs_per_call: int, callgrind: Callgrind | None = None) -> dict[str, Any]:
    """Enqueue `jobs`, then drain them by finish calls of `runs_per_call` runs (one client)."""
    redis = Redis.from_url(url)
    namespace = f"cost-{uuid.uuid4().hex[:8]}"
    try:
        async with Agent(AgentSettings(redis_url=url, namespace=namespace)) as agent:
            client = ClientAgent(agent)
            engine, store = agent.engine, agent.job_store
            # The worker's own builders of its claim and its finishes (a Hooks, as run_worker makes).
            hooks = engine._hooks(agent.worker, lambda: agent.scheduler)
            pickup = hooks.claim_pickup(aborts=False)
            ttl_ms, read_limit = 60_000, 1000
            claims = ClaimAsMany(lambda n: claim_in_finish(n, ttl_ms=ttl_ms, read_limit=read_limit, pickup=pickup))
            finisher = hooks.finisher(lambda: redis, queue=engine.names.queue, aborts=False, batch=True, claims=claims)
            # Both scripts loaded before the drain (a first call's SCRIPT LOAD is not a job's cost).
            await redis.script_load(pickup.script.source)
            await redis.script_load(finisher.script.source)

            async def enqueue() -> None:
                for start in range(0, jobs, ENQUEUE_BATCH):
                    await client.enqueue_many([Noop() for _ in range(min(ENQUEUE_BATCH, jobs - start))])

            async def drain() -> None:
                call = claim_call(engine.names.queue, engine.names.wake_key, wanted=runs_per_call, ttl_ms=ttl_ms,
                                  read_limit=read_limit, pickup=pickup)
                claimed = parse_claim(await run_script(redis, call))
                done = 0
                while claimed.jobs:
                    ends = []
                    for engine_id, _ in claimed.jobs:
                        job_id = engine.names.job_id(engine_id)
                        if job_id is None:
                            raise SystemExit(f"not a job of this namespace: {engine_id}")
                        start = claimed.picked[engine_id].start
                        attempt = int(start[0]) if start else 0
                        transition = store.transition_of(job_id, JobStatus.SUCCESS, result={}, attempt=attempt)
                        ends.append(RunEnd(engine_id, transition, done=True))
                    # Submitted in one turn of the loop: they go out in one call (group commit).
                    await asyncio.gather(*(finisher.finish(end) for end in ends))
                    done += len(ends)
                    claimed = parse_claim(claims.replies.pop())
                if done != jobs:
                    raise SystemExit(f"drained {done} of {jobs} jobs")

            enqueued = await measure(redis, enqueue, jobs, callgrind)
            drained = await measure(redis, drain, jobs, callgrind)
            if finisher.stats.largest != runs_per_call:
                raise SystemExit(f"finish calls of {finisher.stats.largest} runs, not {runs_per_call}")
        return {"enqueue": enqueued, "drain": drained}
    finally:
        await redis.aclose()


async def scripted(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in RUNS_PER_CALL}
    for i in range(args.rounds):
        for k in RUNS_PER_CALL:
            out_dir = tempfile.mkdtemp(prefix="redis-cost-")
            server = RedisServer(Callgrind.wrapper(out_dir) if args.callgrind else ())
            callgrind = Callgrind(server, out_dir) if args.callgrind else None
            try:
                run = await scripted_run(server.url, args.jobs, k, callgrind)
            finally:
                server.stop()
                shutil.rmtree(out_dir, ignore_errors=True)
            runs[k].append(run)
            e, d = run["enqueue"], run["drain"]
            ir = f" ({e['ir']:,} / {d['ir']:,} instructions)" if callgrind else ""
            print(f"round {i + 1} scripted {k:>2} runs per call{ir}: enqueue {e['cpu_us']:6.1f} µs/job "
                  f"{e['calls_per_job']:.2f} cmds/job; drain {d['cpu_us']:6.1f} µs/job {d['calls_per_job']:.2f} "
                  f"cmds/job; top {d['top']}", flush=True)
    fields = ("cpu_us", "user_us", "calls_per_job", *(("ir",) if args.callgrind else ()))
    return {
        str(k): {f"{phase}_{field}": median_of(k_runs, phase, field) for phase in ("enqueue", "drain")
                 for field in fields}
        for k, k_runs in runs.items()
    }


# -- worker: a real fast worker ---------------------------------------------------------------------


async def worker_main(url: str, namespace: str, variant: str) -> None:
    async with Agent(settings(url, namespace, variant)) as agent:
        await agent.run_worker(burst=True)
    print("{}")


async def worker_run(variant: str, jobs: int) -> dict[str, Any]:
    server = RedisServer()
    redis = Redis.from_url(server.url)
    namespace = f"cost-{uuid.uuid4().hex[:8]}"
    try:
        async with Agent(settings(server.url, namespace, variant)) as agent:
            client = ClientAgent(agent)

            async def enqueue() -> None:
                for start in range(0, jobs, 200):
                    await asyncio.gather(*(client.enqueue(Noop(), "bench") for _ in range(min(200, jobs - start))))

            async def drain() -> None:
                await asyncio.to_thread(
                    run_worker_subprocess, __file__, variant, "--namespace", namespace, "--redis-url", server.url
                )

            enqueued = await measure(redis, enqueue, jobs)
            drained = await measure(redis, drain, jobs)
            stats = await client.queue_stats()
            if stats.depth:
                raise SystemExit(f"{stats.depth} jobs were left in the queue")
        return {"enqueue": enqueued, "drain": drained}
    finally:
        await redis.aclose()
        server.stop()


def median_of(runs: list[dict[str, Any]], phase: str, field: str) -> float:
    return round(statistics.median(run[phase][field] for run in runs), 2)


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for i in range(args.rounds):
        for variant in VARIANTS:
            run = await worker_run(variant, args.jobs)
            runs[variant].append(run)
            for phase in ("enqueue", "drain"):
                r = run[phase]
                print(f"round {i + 1} worker {variant:>10} {phase:>7}: cpu {r['cpu_us']:6.1f} µs/job (user "
                      f"{r['user_us']:6.1f}), scripts "
                      f"{r['script_us']:5.1f} (own Lua >= {r['lua_own_us_at_least']:5.1f}), other commands "
                      f"{r['commands_us']:5.1f}; {r['calls_per_job']:.2f} calls/job; top {r['top']}", flush=True)
    fields = ("cpu_us", "user_us", "script_us", "commands_us", "lua_own_us_at_least", "calls_per_job")
    figures: dict[str, Any] = {
        variant: {f"{phase}_{field}": median_of(variant_runs, phase, field) for phase in ("enqueue", "drain")
                  for field in fields}
        for variant, variant_runs in runs.items()
    }
    full = figures["full"]
    return {
        "variants": figures,
        "cpu_us_per_job": round(full["enqueue_cpu_us"] + full["drain_cpu_us"], 1),
        "events_cost_us": round(full["drain_cpu_us"] - figures["no_events"]["drain_cpu_us"], 1),
        "metrics_cost_us": round(full["drain_cpu_us"] - figures["no_metrics"]["drain_cpu_us"], 1),
        "linger_saves_us": round(figures["no_linger"]["drain_cpu_us"] - full["drain_cpu_us"], 1),
    }


async def main(args: argparse.Namespace) -> None:
    out: dict[str, Any] = {"jobs": args.jobs, "rounds": args.rounds}
    if args.mode in ("scripted", "both"):
        out["scripted"] = await scripted(args)
    if args.mode in ("worker", "both"):
        out["worker"] = await worker(args)
    print(json.dumps(out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", choices=("scripted", "worker", "both"), default="scripted")
    parser.add_argument("--callgrind", action="store_true",
                        help="scripted mode: run Redis under valgrind's callgrind and count its instructions")
    parser.add_argument("--worker", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        asyncio.run(worker_main(arguments.redis_url, arguments.namespace, arguments.worker))
    else:
        asyncio.run(main(arguments))
