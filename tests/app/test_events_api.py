"""Server-Sent Events and live workers over real HTTP: the app served by hypercorn on 127.0.0.1, read
with httpx streaming. GET /jobs/<id>/events, GET /admin/events, GET /admin/workers."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import httpx
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config
from quart import Quart

from agent_async import Job, JobRequest, JobStatus, agent_job, report_progress
from agent_async.registry import JobRegistry
from agent_async.testing import running_worker, wait_for_status
from app.api import sse
from app.auth import TokenSigner
from app.factory import create_app
from app.runtime import EXTENSION_KEY, AppRuntime
from tests.app.conftest import SECRET, make_settings

pytestmark = pytest.mark.timeout(30)

STEPS = "tests.app.events.steps"


def declare_jobs() -> None:
    @dataclass
    class Steps(JobRequest):
        name: ClassVar[str] = STEPS
        steps: int = 2
        pause_s: float = 0.3  # more than the 0.25 s progress coalescing: every step is written

    @agent_job
    class StepsJob(Job[Steps]):
        request_class = Steps

        async def process(self, request: Steps, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            for step in range(1, request.steps + 1):
                await report_progress(step / request.steps, f"step {step}", step=step)
                await asyncio.sleep(request.pause_s)
            return {"steps": request.steps}


@dataclass
class Served:
    app: Quart
    runtime: AppRuntime
    http: httpx.AsyncClient

    def headers(self, uid: str, *, admin: bool = False, last_event_id: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {TokenSigner(SECRET, max_age_s=60).issue(uid, admin=admin)}"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        return headers

    async def enqueue(self, user: str, **payload: Any) -> str:
        return await self.runtime.client.enqueue_named(STEPS, payload, user)

    @asynccontextmanager
    async def draining(self) -> AsyncIterator[None]:
        """A real worker in burst mode in the background: it ends by itself once the queue is empty, so it
        is never stopped in the middle of a job (which could leave a Redis connection behind)."""
        worker = asyncio.create_task(self.runtime.agent.run_worker(burst=True, poll_delay=0, handle_signals=False))
        try:
            yield
        finally:
            await asyncio.wait_for(worker, 10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
async def served(sqlite_url: str, namespace: str, redis: Any, job_registry: JobRegistry) -> AsyncIterator[Served]:
    """The app served by hypercorn (lifespan included) in this test's event loop, and an httpx client."""
    declare_jobs()
    app = create_app(make_settings(sqlite_url, namespace))
    app.config[sse.HEARTBEAT_CONFIG_KEY] = 0.2
    port = _free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.graceful_timeout = 1.0
    config.accesslog = None
    stop = asyncio.Event()
    server = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        for _ in range(200):
            try:
                if (await http.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.02)
        else:
            raise AssertionError("the server did not start")
        try:
            yield Served(app=app, runtime=app.extensions[EXTENSION_KEY], http=http)
        finally:
            stop.set()
            await asyncio.wait_for(server, 10)


@dataclass
class Frame:
    id: str | None = None
    event: str | None = None
    data: dict[str, Any] | None = None
    comment: str | None = None


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    """The SSE frames of a streamed response, a comment line being a frame of its own."""
    frame = Frame()
    async for line in response.aiter_lines():
        if line == "":
            if frame != Frame():
                yield frame
            frame = Frame()
        elif line.startswith(":"):
            yield Frame(comment=line[1:].strip())
        else:
            field, _, value = line.partition(": ")
            if field == "data":
                frame.data = json.loads(value)
            else:
                setattr(frame, field, value)


@asynccontextmanager
async def stream(served: Served, url: str, headers: dict[str, str]) -> AsyncIterator[httpx.Response]:
    async with served.http.stream("GET", url, headers=headers) as response:
        yield response


async def read_all(served: Served, url: str, headers: dict[str, str]) -> list[Frame]:
    """Every event frame until the server ends the stream (heartbeats skipped)."""
    async with asyncio.timeout(10), stream(served, url, headers) as response:
        assert response.status_code == 200, await response.aread()
        return [f async for f in frames(response) if f.comment is None]


async def wait_closed(baseline: int) -> None:
    for _ in range(200):
        if sse.open_streams() == baseline:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{sse.open_streams() - baseline} event stream(s) still open on the server")


def statuses(events: list[Frame]) -> list[tuple[str | None, str]]:
    return [(f.event, f.data["status"]) for f in events if f.data is not None]


async def test_a_job_whole_life_in_order_then_the_stream_ends(served: Served) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    job_id = await served.enqueue(user, steps=2)
    url = f"/jobs/{job_id}/events"
    async with served.draining(), asyncio.timeout(10), stream(served, url, served.headers(user)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        events = [f async for f in frames(response) if f.comment is None]
    assert statuses(events) == [
        ("status", "PENDING"), ("status", "STARTED"), ("progress", "STARTED"), ("progress", "STARTED"),
        ("status", "SUCCESS"),
    ]
    ids = [f.id for f in events]
    assert ids == [f.data["id"] for f in events if f.data] and len(set(ids)) == len(ids)
    first, progress, last = events[0].data, events[2].data, events[-1].data
    assert first is not None and progress is not None and last is not None
    assert set(first) == {"id", "type", "job_id", "status", "name", "user_uid", "attempts", "at_ms", "error",
                          "fraction", "message"}
    assert (first["job_id"], first["name"], first["user_uid"]) == (job_id, STEPS, user)
    assert (progress["fraction"], progress["message"]) == (0.5, "step 1")
    assert last["error"] is None and last["attempts"] == 1

    # The public view carries the last progress report.
    view = (await served.http.get(f"/jobs/{job_id}", headers=served.headers(user))).json()
    assert view["status"] == "SUCCESS"
    assert {k: view["progress"][k] for k in ("fraction", "message", "details")} == {
        "fraction": 1.0, "message": "step 2", "details": {"step": 2},
    }
    datetime.fromisoformat(view["progress"]["updated_at"])

    # Reconnecting once everything was seen: 204, which tells an EventSource to stop.
    again = await served.http.get(f"/jobs/{job_id}/events", headers=served.headers(user, last_event_id=ids[-1]))
    assert again.status_code == 204 and again.content == b""
    # A finished job replayed from its start: the same events, and the stream ends at once.
    assert [f.id for f in await read_all(served, f"/jobs/{job_id}/events", served.headers(user))] == ids


async def test_a_reconnect_with_last_event_id_replays_the_rest_without_duplicates(served: Served) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    job_id = await served.enqueue(user, steps=2)
    baseline = sse.open_streams()
    async with asyncio.timeout(10), stream(served, f"/jobs/{job_id}/events", served.headers(user)) as response:
        first = await anext(f async for f in frames(response) if f.comment is None)
        assert sse.open_streams() == baseline + 1
    # The client hung up: the server closed its generator (and the Redis reader in it).
    await wait_closed(baseline)
    assert first.event == "status" and first.data is not None and first.data["status"] == "PENDING"
    assert first.id is not None

    async with served.draining():
        await wait_for_status(served.runtime.agent, job_id, JobStatus.SUCCESS)
    rest = await read_all(served, f"/jobs/{job_id}/events", served.headers(user, last_event_id=first.id))
    assert statuses(rest) == [
        ("status", "STARTED"), ("progress", "STARTED"), ("progress", "STARTED"), ("status", "SUCCESS"),
    ]
    assert first.id not in {f.id for f in rest}
    await wait_closed(baseline)


async def test_a_last_event_id_inside_an_entry_of_several_resumes_after_that_event(served: Served) -> None:
    """Three jobs queued by one call: their PENDING events share a stream entry (ids <entry>.0-2). The
    second job's stream resumed after <entry>.0 replays its PENDING (<entry>.1); after <entry>.1,
    nothing (it stays PENDING: no worker), a keep-alive first."""
    user = f"user-{uuid.uuid4().hex[:8]}"
    request_class = served.runtime.agent.registry.request(STEPS)
    assert request_class is not None
    results = await served.runtime.client.enqueue_many([request_class() for _ in range(3)], user)
    second = results[1].job_id
    events = await served.runtime.agent.events.read()
    entry = events[0].event_id.partition(".")[0]
    assert [e.event_id for e in events] == [f"{entry}.{k}" for k in range(3)]
    url = f"/jobs/{second}/events"
    async with asyncio.timeout(5), stream(served, url, served.headers(user, last_event_id=f"{entry}.0")) as response:
        assert response.status_code == 200
        first = await anext(f async for f in frames(response))
    assert first.id == f"{entry}.1" and first.data is not None and first.data["job_id"] == second
    async with asyncio.timeout(5), stream(served, url, served.headers(user, last_event_id=f"{entry}.1")) as response:
        assert response.status_code == 200
        assert (await anext(f async for f in frames(response))).comment == "keep-alive"
    for bad in (f"{entry}.", f"{entry}.x", f"{entry}.12345"):
        refused = await served.http.get(url, headers=served.headers(user, last_event_id=bad))
        assert refused.status_code == 422 and refused.json()["error"] == "invalid_body", bad


async def test_a_heartbeat_comment_while_idle_and_the_stream_is_freed_on_disconnect(served: Served) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    job_id = await served.enqueue(user)  # no worker: it stays PENDING
    baseline = sse.open_streams()
    seen: list[Frame] = []
    async with asyncio.timeout(5), stream(served, f"/jobs/{job_id}/events", served.headers(user)) as response:
        async for frame in frames(response):
            seen.append(frame)
            if frame.comment is not None:
                break
    assert seen[0].data is not None and seen[0].data["status"] == "PENDING"
    assert seen[-1].comment == "keep-alive"
    await wait_closed(baseline)


async def test_another_users_job_unknown_jobs_and_bad_ids(served: Served) -> None:
    owner, stranger = f"user-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
    job_id = await served.enqueue(owner)
    foreign = await served.http.get(f"/jobs/{job_id}/events", headers=served.headers(stranger))
    assert foreign.status_code == 403 and foreign.json()["error"] == "forbidden"
    # Exactly as GET /jobs/<id> answers.
    assert (await served.http.get(f"/jobs/{job_id}", headers=served.headers(stranger))).json() == foreign.json()
    unknown = await served.http.get("/jobs/0123456789abcdef/events", headers=served.headers(owner))
    assert unknown.status_code == 404 and unknown.json()["error"] == "job_not_found"
    bad = await served.http.get(
        f"/jobs/{job_id}/events", headers=served.headers(owner, last_event_id="not-an-id")
    )
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_body"
    assert (await served.http.get(f"/jobs/{job_id}/events")).status_code == 401
    # An admin may follow anyone's job.
    async with asyncio.timeout(5), stream(served, f"/jobs/{job_id}/events", served.headers("root", admin=True)) as r:
        assert r.status_code == 200
        assert (await anext(f async for f in frames(r))).event == "status"


async def test_admin_events_refuse_non_admins_and_filter(served: Served) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    refused = await served.http.get("/admin/events", headers=served.headers(user))
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    invalid = await served.http.get("/admin/events?status=DONE", headers=served.headers("root", admin=True))
    assert invalid.status_code == 422 and invalid.json()["error"] == "invalid_body"

    baseline = sse.open_streams()
    admin = served.headers("root", admin=True)
    url = f"/admin/events?status=SUCCESS&job={STEPS}&user={user}"
    async with asyncio.timeout(10), stream(served, url, admin) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        # "From now on" starts before the headers are sent: the job enqueued now is seen.
        job_id = await served.enqueue(user, steps=1, pause_s=0.0)
        other = await served.enqueue(f"other-{user}", steps=1, pause_s=0.0)
        received: list[Frame] = []
        async with served.draining():
            async for frame in frames(response):
                received.append(frame)
                if frame.data is not None:
                    break
    await wait_closed(baseline)
    events = [f.data for f in received if f.data is not None]
    assert [(e["job_id"], e["status"], e["type"]) for e in events] == [(job_id, "SUCCESS", "status")]
    assert other != job_id


async def test_admin_workers_lists_a_running_worker(served: Served) -> None:
    refused = await served.http.get("/admin/workers", headers=served.headers("someone"))
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    admin = served.headers("root", admin=True)
    assert (await served.http.get("/admin/workers", headers=admin)).json() == {"workers": []}
    async with running_worker(served.runtime.agent):
        for _ in range(200):
            workers = (await served.http.get("/admin/workers", headers=admin)).json()["workers"]
            if workers:
                break
            await asyncio.sleep(0.02)
    (worker,) = workers
    assert set(worker) == {"worker_id", "host", "pid", "started_at", "jobs_running", "heartbeat_at"}
    assert worker["pid"] > 0 and worker["jobs_running"] == 0 and worker["host"] == socket.gethostname()
    assert datetime.fromisoformat(worker["started_at"]) <= datetime.fromisoformat(worker["heartbeat_at"])
