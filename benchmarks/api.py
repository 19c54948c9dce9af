"""Requests/s of GET /jobs/<id> (auth + state read + serializer) against a bare Quart route, over real HTTP.

Usage: python benchmarks/api.py [--seconds S] [--concurrency C] [--redis-url URL]

Both sides: one hypercorn process started the same way (`python -m hypercorn MODULE:APP --bind
127.0.0.1:<free port> --workers 1`, no access log), C keep-alive HTTP/1.1 connections driven by a
minimal asyncio client (so the load generator costs as little as possible), a 1 s warm-up, then
S seconds measured. The job read is a finished export (SUCCESS, result with a large_result to drop).
The app runs with AGENT_API_GC_FREEZE on, as compose.yaml's api does (`--no-gc-freeze`: off).
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from quart import Quart, Response, jsonify
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the reference app is not installed: it is imported from the checkout
SECRET = "benchmark-secret-key-0123456789"
WARMUP_S = 1.0

# The baseline: a bare Quart route returning constant JSON (`python -m hypercorn api:baseline_app`).
baseline_app = Quart("baseline")


@baseline_app.get("/ping")
async def ping() -> Response:
    return jsonify({"status": "SUCCESS", "payload": {}, "result": None, "error": None})


@dataclass
class Stats:
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(target: str, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "hypercorn", target, "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{target} exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{target} did not start")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def connection(port: int, request: bytes, until: float, stats: Stats | None) -> None:
    """One keep-alive connection sending requests back to back until `until` (monotonic seconds)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            if stats is not None:
                stats.latencies_s.append(time.perf_counter() - t0)
                if head[9:12] != b"200":
                    stats.errors += 1
    finally:
        writer.close()
        await writer.wait_closed()


async def load(port: int, path: str, headers: dict[str, str], seconds: float, concurrency: int) -> Stats:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode()
    warm_until = time.perf_counter() + WARMUP_S
    await asyncio.gather(*(connection(port, request, warm_until, None) for _ in range(concurrency)))
    stats = Stats()
    until = time.perf_counter() + seconds
    await asyncio.gather(*(connection(port, request, until, stats) for _ in range(concurrency)))
    return stats


def p99_ms(stats: Stats) -> float:
    ordered = sorted(stats.latencies_s)
    return round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2) if ordered else 0.0


async def finished_export(env: dict[str, str]) -> str:
    """A SUCCESS export job owned by `bench`, created through the app and a burst worker in this process."""
    os.environ.update(env)
    from app.factory import create_app
    from app.runtime import EXTENSION_KEY, AppRuntime

    app = create_app()
    runtime: AppRuntime = app.extensions[EXTENSION_KEY]
    async with app.test_app() as test_app:
        client = test_app.test_client()
        headers = {"Authorization": f"Bearer {runtime.require_signer().issue('bench')}"}
        key = (await (await client.post("/calendars", json={"name": "Bench"}, headers=headers)).get_json())["key"]
        for day in range(1, 6):
            start, end = f"2030-01-0{day}T09:00:00Z", f"2030-01-0{day}T10:00:00Z"
            event = {"summary": f"Event {day}", "start": start, "end": end}
            await client.post(f"/calendars/{key}/events", json=event, headers=headers)
        job_id: str = (await (await client.post(f"/calendars/{key}/export", headers=headers)).get_json())["job_id"]
        await runtime.agent.run_worker(burst=True, poll_delay=0)
        state = await runtime.client.get_state(job_id)
        if state is None or state.status.value != "SUCCESS":
            raise RuntimeError(f"the export job did not succeed: {state}")
    return job_id


async def cleanup(redis_url: str, namespace: str) -> None:
    redis = Redis.from_url(redis_url)
    try:
        for pattern in (f"{namespace}:*", f"arq:*:{namespace}:*"):
            keys = [k async for k in redis.scan_iter(match=pattern, count=1000)]
            if keys:
                await redis.delete(*keys)
    finally:
        await redis.aclose()


def measure(target: str, path: str, headers: dict[str, str], env: dict[str, str], args: argparse.Namespace) -> Stats:
    port = free_port()
    proc = start_server(target, env, port)
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)) as r:
            if r.status != 200:
                raise RuntimeError(f"{target} {path} answered {r.status}")
        return asyncio.run(load(port, path, headers, args.seconds, args.concurrency))
    finally:
        stop_server(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default=os.environ.get("AGENT_REDIS_URL", "redis://127.0.0.1:6379/15"))
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="serve without AGENT_API_GC_FREEZE (compose.yaml's api sets it)")
    args = parser.parse_args()

    namespace = f"bench-api-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AGENT_")},
            "AGENT_REDIS_URL": args.redis_url,
            "AGENT_NAMESPACE": namespace,
            "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp}/bench.db",
            "AGENT_SECRET_KEY": SECRET,
            # As compose.yaml's api runs (the baseline app has no such setting: its heap is Quart's alone).
            "AGENT_API_GC_FREEZE": "false" if args.no_gc_freeze else "true",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]),
        }
        from app.migrate import upgrade

        upgrade(env["AGENT_DATABASE_URL"])
        try:
            job_id = asyncio.run(finished_export(env))
            from app.auth import TokenSigner

            token = TokenSigner(SECRET, max_age_s=3600).issue("bench")
            # Paired rounds and medians: the machine's noise moves either side by 20% or more.
            rounds = []
            for _ in range(args.rounds):
                jobs = measure("app.asgi:app", f"/jobs/{job_id}", {"Authorization": f"Bearer {token}"}, env, args)
                base = measure("api:baseline_app", "/ping", {}, env, args)
                rounds.append((jobs, base))
        finally:
            asyncio.run(cleanup(args.redis_url, namespace))

    ratios = []
    for i, (jobs, base) in enumerate(rounds, 1):
        jobs_rps = len(jobs.latencies_s) / args.seconds
        base_rps = len(base.latencies_s) / args.seconds
        print(f"round {i}: GET /jobs/<id> {jobs_rps:.0f} req/s (p99 {p99_ms(jobs)} ms, {jobs.errors} non-200), "
              f"bare Quart route {base_rps:.0f} req/s (p99 {p99_ms(base)} ms, {base.errors} non-200)")
        if jobs.errors or base.errors:
            raise SystemExit("non-200 answers during the run: the numbers are not valid")
        ratios.append(jobs_rps / base_rps if base_rps else 0.0)
    middle = sorted(range(len(rounds)), key=lambda i: ratios[i])[len(rounds) // 2]
    jobs, base = rounds[middle]
    print(json.dumps({
        "jobs_get_rps": round(len(jobs.latencies_s) / args.seconds, 1),
        "baseline_rps": round(len(base.latencies_s) / args.seconds, 1),
        "ratio": round(ratios[middle], 3),
        "ratio_per_round": [round(r, 3) for r in ratios],
        "p99_ms": p99_ms(jobs),
        "baseline_p99_ms": p99_ms(base),
        "api_gc_freeze": not args.no_gc_freeze,
    }))


if __name__ == "__main__":
    main()
