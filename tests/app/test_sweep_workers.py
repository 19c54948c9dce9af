"""A full sweep of 50 external calendars across two real worker processes (`python -m app worker`),
with the ConnectionGuard pacing each host across both: the run record, the pacing seen by the
server, the guards' state, and both processes taking part."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_async import JobStatus, RunStatus
from app.factory import create_app
from app.module.calendar.sweep_requests import SWEEP_RUN_KIND, JobRequestSyncExternalAuto
from app.runtime import EXTENSION_KEY
from tests.app.conftest import SECRET, Api, ics_with_events, make_settings
from tests.app.test_external_calendars import ALLOW, _set_last_sync, subscribe
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CALENDARS_PER_HOST = {"127.0.0.1": 30, "localhost": 20}
MIN_INTERVAL_S = 0.08
# Redis's TIME and this process's time.time() read one clock; this covers their rounding.
CLOCK_TOLERANCE_S = 0.002


class TimingServer(ThreadingHTTPServer):
    """Serves `/<name>.ics` and notes when each request arrived, on threads of its own: the test's
    event loop (busy polling) would otherwise note arrivals late and in bunches."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.arrivals: list[tuple[float, str]] = []  # (time.monotonic(), Host header)
        self._lock = threading.Lock()

    def url(self, path: str, host: str) -> str:
        return f"http://{host}:{self.server_address[1]}{path}"


class _Handler(BaseHTTPRequestHandler):
    server: TimingServer

    def do_GET(self) -> None:
        with self.server._lock:
            self.server.arrivals.append((time.time(), self.headers.get("Host", "")))
        body = ics_with_events(2, prefix=self.path.strip("/").removesuffix(".ics")).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/calendar; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[TimingServer]:
    server = TimingServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _worker_env(namespace: str, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update(
        AGENT_NAMESPACE=namespace, AGENT_DATABASE_URL=database_url, AGENT_REDIS_URL=REDIS_URL,
        AGENT_SECRET_KEY=SECRET, AGENT_FETCH_ALLOW_HOSTS=",".join(ALLOW),
        AGENT_ICS_MIN_INTERVAL_SECONDS=str(MIN_INTERVAL_S), AGENT_ICS_SWEEP_MAX_IN_FLIGHT="10",
        # No cron sweep of its own: the test starts the one sweep it measures.
        AGENT_SCHEDULE_ALLOWLIST="admin.cleanup.large_store", AGENT_WORKER_MAX_JOBS="5",
        PYTHONUNBUFFERED="1",
    )
    return env


async def test_fifty_calendars_swept_by_two_workers_paced_per_host(
    postgresql_url: str, namespace: str, redis: Redis, upstream: TimingServer, tmp_path: Path
) -> None:
    settings = dataclasses.replace(
        make_settings(postgresql_url, namespace, schedule_allowlist=("admin.cleanup.large_store",)),
        fetch_allow_hosts=ALLOW, ics_min_interval_s=MIN_INTERVAL_S,
    )
    app = create_app(settings)
    async with app.test_app() as test_app:
        api = Api(app=app, client=test_app.test_client(), runtime=app.extensions[EXTENSION_KEY])
        hosts_keys: dict[str, list[str]] = {host: [] for host in CALENDARS_PER_HOST}
        for i in range(max(CALENDARS_PER_HOST.values())):  # the hosts interleaved
            for host, count in CALENDARS_PER_HOST.items():
                if i < count:
                    url = upstream.url(f"/{host}-{i}.ics", host=host)
                    hosts_keys[host].append((await subscribe(api, f"owner-{i % 7}", url))["key"])
        keys = [key for host_keys in hosts_keys.values() for key in host_keys]
        # Only these calendars are due: every other one in the shared database was "just synced".
        await _set_last_sync(api, datetime.now(UTC))
        for key in keys:
            await _set_last_sync(api, datetime.now(UTC) - timedelta(days=1), key)

        logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
        procs = []
        for log in logs:
            with log.open("wb") as stderr:  # the child keeps its own copy of the descriptor
                procs.append(subprocess.Popen(  # noqa: ASYNC220 (started once; nothing else runs meanwhile)
                    [sys.executable, "-m", "app", "worker"], cwd=ROOT,
                    env=_worker_env(namespace, postgresql_url), stdout=subprocess.DEVNULL, stderr=stderr,
                ))
        try:
            await _wait_for_workers(api, 2)
            sweep_id = await api.runtime.client.enqueue(JobRequestSyncExternalAuto())
            record = await _wait_for_run_end(api, sweep_id, timeout_s=90)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                assert proc.wait(timeout=60) == 0, logs[procs.index(proc)].read_text()[-3000:]

        total = sum(CALENDARS_PER_HOST.values())
        assert record.status is RunStatus.SUCCESS, record
        assert record.counters == {"due": total, "synced": total, "unchanged": 0, "failed": 0}
        assert record.group_id is not None
        group = await api.runtime.client.get_group(record.group_id)
        assert group is not None and group.succeeded == total

        # Pacing, as the server saw it: per host, requests never closer than the interval (less
        # the jitter of their arrival), and on average at least the interval apart.
        # Pacing. The guard hands out each host's slots at least the interval apart, across both
        # processes (each sync's result says when its slot was: `fetched_at`, Redis's clock), and no
        # request reaches the server before its slot. The gaps the server sees are printed, not
        # asserted: a process the machine starves after its slot sends late, and then two requests
        # can arrive closer than the interval (no client-side guard can prevent that).
        children = await api.runtime.client.list_jobs(name="calendar.sync.external", limit=total + 10)
        assert len(children) == total and all(c.status is JobStatus.SUCCESS for c in children)
        slots_by_url = {c.payload["calendar_key"]: datetime.fromisoformat(c.result["fetched_at"]).timestamp()
                        for c in children if c.payload and c.result}
        assert len(slots_by_url) == total
        host_of = {key: host for host, keys_of in hosts_keys.items() for key in keys_of}
        figures: dict[str, Any] = {}
        for host, count in CALENDARS_PER_HOST.items():
            slots = sorted(t for key, t in slots_by_url.items() if host_of[key] == host)
            slot_gaps = [b - a for a, b in itertools.pairwise(slots)]
            assert min(slot_gaps) >= MIN_INTERVAL_S - 0.001, (host, sorted(slot_gaps)[:5])
            arrivals = sorted(t for t, seen_host in upstream.arrivals if seen_host.startswith(host + ":"))
            assert len(arrivals) == count, (host, len(arrivals))
            # Same machine, same clock (Redis TIME and time.time()): the n-th arrival is at or after the n-th slot.
            early = [a - s for a, s in zip(arrivals, slots, strict=True) if a < s - CLOCK_TOLERANCE_S]
            assert not early, (host, early[:5])
            arrival_gaps = [b - a for a, b in itertools.pairwise(arrivals)]
            figures[host] = {"requests": count, "min_slot_gap_ms": round(min(slot_gaps) * 1000, 1),
                             "median_arrival_gap_ms": round(statistics.median(arrival_gaps) * 1000, 1),
                             "min_arrival_gap_ms": round(min(arrival_gaps) * 1000, 1)}
        # Two hosts are two connections: paced side by side, not one after the other.
        spans = {h: (min(t for t, s in upstream.arrivals if s.startswith(h + ":")),
                     max(t for t, s in upstream.arrivals if s.startswith(h + ":"))) for h in CALENDARS_PER_HOST}
        (a_start, a_end), (b_start, b_end) = spans.values()
        assert a_start < b_end and b_start < a_end, spans

        # Both processes ran syncs: each child's id is in the log of the worker that ran it.
        texts = [log.read_text() for log in logs]
        ran = [sum(1 for child in children if child.job_id in text) for text in texts]
        assert all(n > 0 for n in ran) and sum(ran) >= total, ran

        # The guards of both hosts, as an operator reads them: closed, no failures, paced.
        response = await api.client.get("/admin/guards", headers=api.headers("root", admin=True))
        guards = {g["name"]: g for g in (await response.get_json())["guards"]}
        for host in CALENDARS_PER_HOST:
            assert guards[f"ics:{host}"]["state"] == "closed" and guards[f"ics:{host}"]["failures"] == 0
        print("sweep figures:", {"workers": 2, "per_worker_syncs": ran, **figures,
                                 "run_s": round(((record.finished_ms or 0) - record.started_ms) / 1000, 2)})


async def _wait_for_workers(api: Api, count: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while len(await api.runtime.client.workers()) < count:
        assert time.monotonic() < deadline, "the worker processes did not register"
        await asyncio.sleep(0.1)


async def _wait_for_run_end(api: Api, sweep_id: str, *, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        state = await api.runtime.client.get_state(sweep_id)
        if state is not None and state.status is JobStatus.SUCCESS and state.result:
            record = await api.runtime.agent.runs.get(state.result["run_id"])
            if record is not None and record.kind == SWEEP_RUN_KIND and record.status is not RunStatus.RUNNING:
                return record
        assert state is None or state.status is not JobStatus.FAILURE, state.error
        assert time.monotonic() < deadline, f"the sweep did not end: {state}"
        await asyncio.sleep(0.1)
