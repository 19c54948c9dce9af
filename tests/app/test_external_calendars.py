"""External ICS calendars: subscribe (SSRF refusals), sync through a real local HTTP server, the
ConnectionGuard per host, revalidation of queued syncs.

The upstream is a real HTTP/1.1 server on 127.0.0.1 (`asyncio.start_server`, a few lines of
protocol), reachable only because these tests allow 127.0.0.1 and localhost through the app's
`fetch_allow_hosts` (AGENT_FETCH_ALLOW_HOSTS); without it the very same URLs are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import text

from agent_async import ConfigurationError, JobStatus, RunStatus, RunTrigger
from app.db import create_app_engine
from app.factory import create_app
from app.migrate import upgrade
from app.module.calendar.fetch import (
    FetchErrorKind,
    FetchPolicy,
    PermanentFetchError,
    RetryableFetchError,
    address_refusal,
    fetch_ics,
)
from app.module.calendar.jobs.sync_external_auto import interleave_hosts
from app.module.calendar.model import Event
from app.module.calendar.repository import CalendarRepository, DueCalendar
from app.module.calendar.requests import JobRequestSyncExternal
from app.module.calendar.sweep_requests import (
    SWEEP_RUN_KIND,
    JobRequestSyncExternalAuto,
    JobRequestSyncExternalDone,
)
from app.runtime import EXTENSION_KEY
from app.settings import AppSettings
from tests.app.conftest import Api, ics_with_events, make_settings

# --- the upstream server -----------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stall_s: float = 0.0  # wait this long before answering anything
    content_length: bool = True  # False: no Content-Length, the body ends with the connection


Handler = Callable[[dict[str, str]], Reply]


class Upstream:
    """A minimal HTTP/1.1 server: one request per connection, answered by the handler of its path."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler | list[Handler]] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.arrivals: list[tuple[float, str]] = []  # (time.monotonic(), Host header) of each request
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def hits(self, path: str) -> list[dict[str, str]]:
        return [headers for seen_path, headers in self.seen if seen_path == path]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            lines = head.decode("latin-1").split("\r\n")
            _, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            self.seen.append((path, headers))
            self.arrivals.append((time.monotonic(), headers.get("host", "")))
            route = self.routes.get(path)
            if route is None:
                reply = Reply(404, b"not here")
            elif isinstance(route, list):
                reply = (route.pop(0) if len(route) > 1 else route[0])(headers)
            else:
                reply = route(headers)
            if reply.stall_s:
                await asyncio.sleep(reply.stall_s)
            reason = {200: "OK", 302: "Found", 304: "Not Modified", 404: "Not Found", 429: "Too Many Requests",
                      500: "Internal Server Error", 503: "Service Unavailable"}.get(reply.status, "Status")
            out = [f"HTTP/1.1 {reply.status} {reason}", "Connection: close"]
            out += [f"{name}: {value}" for name, value in reply.headers.items()]
            if reply.content_length:
                out.append(f"Content-Length: {len(reply.body)}")
            writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + reply.body)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def ics(body: str, etag: str | None = None) -> Handler:
    """200 with the calendar (and its ETag); 304 when the client already has that ETag."""

    def handler(headers: dict[str, str]) -> Reply:
        if etag is not None and headers.get("if-none-match") == etag:
            return Reply(304, headers={"ETag": etag})
        extra = {"Content-Type": "text/calendar; charset=utf-8"}
        if etag is not None:
            extra["ETag"] = etag
        return Reply(200, body.encode(), extra)

    return handler


def status(code: int, **headers: str) -> Handler:
    return lambda _: Reply(code, b"error", {name.replace("_", "-"): value for name, value in headers.items()})


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = Upstream()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


# Only these tests reach the local server: 127.0.0.1 and localhost allowed although not public.
ALLOW = ("127.0.0.1", "localhost")


@pytest.fixture
async def ext_api(database_url: str, namespace: str, redis: Redis) -> AsyncIterator[Api]:
    # The periodic sweep is left out of the schedules here (test_the_sweep_* enqueue it themselves).
    settings = dataclasses.replace(
        make_settings(database_url, namespace, schedule_allowlist=("admin.cleanup.large_store",)),
        fetch_allow_hosts=ALLOW, fetch_timeout_s=0.5, fetch_max_bytes=64 * 1024,
        ics_min_interval_s=0.0, ics_failure_threshold=2, ics_cooldown_s=60.0,
    )
    app = create_app(settings)
    async with app.test_app() as test_app:
        yield Api(app=app, client=test_app.test_client(), runtime=app.extensions[EXTENSION_KEY])


async def subscribe(api: Api, uid: str, url: str, **extra: Any) -> dict[str, Any]:
    response = await api.client.post(
        "/calendars/external", json={"name": "Feed", "url": url, **extra}, headers=api.headers(uid)
    )
    assert response.status_code == 201, await response.get_data()
    body: dict[str, Any] = await response.get_json()
    return body


async def start_sync(api: Api, uid: str, key: str, query: str = "") -> str:
    response = await api.client.post(f"/calendars/{key}/sync{query}", headers=api.headers(uid))
    assert response.status_code == 202, await response.get_data()
    job_id: str = (await response.get_json())["job_id"]
    return job_id


async def sync(api: Api, uid: str, key: str, query: str = "") -> Any:
    job_id = await start_sync(api, uid, key, query)
    await api.drain()
    return await api.state(job_id)


async def external(api: Api, uid: str, key: str) -> dict[str, Any]:
    response = await api.client.get(f"/calendars/{key}/external", headers=api.headers(uid))
    assert response.status_code == 200, await response.get_data()
    body: dict[str, Any] = await response.get_json()
    return body


async def event_uids(api: Api, uid: str, key: str) -> list[str]:
    response = await api.client.get(f"/calendars/{key}/events?limit=100", headers=api.headers(uid))
    assert response.status_code == 200
    return sorted(event["uid"] for event in (await response.get_json())["events"])


# --- subscribe: validation and SSRF refusals ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:8080/cal.ics", "loopback"),
        ("http://10.0.0.1/cal.ics", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[::1]/cal.ics", "loopback"),
        ("http://[::ffff:192.168.1.1]/cal.ics", "private"),
        ("http://localhost/cal.ics", "the host localhost resolves to a loopback address"),
        ("http://0.0.0.0/cal.ics", "unspecified"),
        ("ftp://example.org/cal.ics", "only http and https"),
        ("http://user:secret@example.org/cal.ics", "credentials"),
        ("not a url", "spaces"),
        ("http://no-such-host.invalid/cal.ics", "could not be resolved"),
    ],
)
async def test_subscribe_refuses_urls_it_may_not_fetch(api: Api, user: str, url: str, why: str) -> None:
    response = await api.client.post(
        "/calendars/external", json={"name": "Feed", "url": url}, headers=api.headers(user)
    )
    assert response.status_code == 422
    body = await response.get_json()
    assert body["error"] == "url_refused" and why in body["message"], body
    listed = await api.client.get("/calendars", headers=api.headers(user))
    assert (await listed.get_json())["calendars"] == []


async def test_the_allow_setting_opens_only_what_it_names(ext_api: Api, user: str) -> None:
    allowed = await subscribe(ext_api, user, "http://127.0.0.1:1/cal.ics")
    assert allowed["url"] == "http://127.0.0.1:1/cal.ics" and allowed["sync_interval_minutes"] == 60
    assert allowed["last_status"] is None and allowed["last_sync_at"] is None
    response = await ext_api.client.post(
        "/calendars/external", json={"name": "x", "url": "http://10.0.0.1/"}, headers=ext_api.headers(user)
    )
    assert response.status_code == 422 and (await response.get_json())["error"] == "url_refused"


@pytest.mark.parametrize("interval", [4, 0, -5, 10081, "often"])
async def test_the_interval_is_validated(ext_api: Api, user: str, interval: Any) -> None:
    response = await ext_api.client.post(
        "/calendars/external", json={"name": "x", "url": "http://127.0.0.1:1/", "sync_interval_minutes": interval},
        headers=ext_api.headers(user),
    )
    assert response.status_code == 422 and (await response.get_json())["error"] == "invalid_body"


async def test_patch_get_and_ownership(ext_api: Api, user: str, other_user: str) -> None:
    key = (await subscribe(ext_api, user, "http://127.0.0.1:1/cal.ics", sync_interval_minutes=5))["key"]
    patched = await ext_api.client.patch(
        f"/calendars/{key}/external", json={"sync_interval_minutes": 15}, headers=ext_api.headers(user)
    )
    assert patched.status_code == 200 and (await patched.get_json())["sync_interval_minutes"] == 15
    assert (await external(ext_api, user, key))["sync_interval_minutes"] == 15
    too_often = await ext_api.client.patch(
        f"/calendars/{key}/external", json={"sync_interval_minutes": 4}, headers=ext_api.headers(user)
    )
    assert too_often.status_code == 422
    # Another user's external calendar: 404 calendar_not_found on every endpoint, like the others.
    for method, path in (("GET", "/external"), ("PATCH", "/external"), ("POST", "/sync")):
        response = await ext_api.client.open(
            f"/calendars/{key}{path}", method=method, headers=ext_api.headers(other_user),
            json={"sync_interval_minutes": 30} if method == "PATCH" else None,
        )
        assert response.status_code == 404 and (await response.get_json())["error"] == "calendar_not_found"
    # A plain calendar has no subscription.
    plain = (await (await ext_api.client.post("/calendars", json={"name": "p"}, headers=ext_api.headers(user)))
             .get_json())["key"]
    response = await ext_api.client.post(f"/calendars/{plain}/sync", headers=ext_api.headers(user))
    assert response.status_code == 404 and (await response.get_json())["error"] == "subscription_not_found"
    # The external calendar is a calendar: listed, and deleted with DELETE /calendars/<key>.
    listed = await (await ext_api.client.get("/calendars", headers=ext_api.headers(user))).get_json()
    assert key in {c["key"] for c in listed["calendars"]}
    assert (await ext_api.client.delete(f"/calendars/{key}", headers=ext_api.headers(user))).status_code == 204
    gone = await ext_api.client.get(f"/calendars/{key}/external", headers=ext_api.headers(user))
    assert gone.status_code == 404


async def test_the_collection_path_is_not_a_calendar_key(ext_api: Api, user: str) -> None:
    for method in ("PATCH", "DELETE", "GET"):
        response = await ext_api.client.open("/calendars/external", method=method, headers=ext_api.headers(user))
        assert response.status_code == 405 and "POST" in response.headers["Allow"], method


# --- syncing ----------------------------------------------------------------------------------------------


async def test_sync_imports_then_304_changes_nothing_then_removals_follow_upstream(
    ext_api: Api, upstream: Upstream, user: str
) -> None:
    upstream.routes["/cal.ics"] = ics(ics_with_events(3), etag='"v1"')
    key = (await subscribe(ext_api, user, upstream.url("/cal.ics")))["key"]

    first = await sync(ext_api, user, key)
    assert first.status is JobStatus.SUCCESS, first.error
    assert first.result is not None
    fetched_at = datetime.fromisoformat(first.result.pop("fetched_at"))
    assert abs((datetime.now(UTC) - fetched_at).total_seconds()) < 30
    assert first.result == {"status": "synced", "imported": 3, "updated": 0, "skipped": 0, "removed": 0}
    view = await external(ext_api, user, key)
    assert view["last_status"] == "synced" and view["last_error"] is None and view["last_sync_at"]
    assert await event_uids(ext_api, user, key) == ["evt-0@test", "evt-1@test", "evt-2@test"]

    second = await sync(ext_api, user, key)
    assert second.status is JobStatus.SUCCESS and second.result is not None
    assert second.result["status"] == "unchanged"
    assert upstream.hits("/cal.ics")[-1]["if-none-match"] == '"v1"'
    assert (await external(ext_api, user, key))["last_status"] == "unchanged"
    assert len(await event_uids(ext_api, user, key)) == 3

    # force=true: a full download without the validators; the same content changes nothing.
    forced = await sync(ext_api, user, key, "?force=true")
    assert "if-none-match" not in upstream.hits("/cal.ics")[-1]
    assert forced.result is not None and forced.result.pop("fetched_at")
    assert forced.result == {"status": "synced", "imported": 0, "updated": 0, "skipped": 3, "removed": 0}

    # Upstream drops two events and changes one: the calendar follows.
    two = ics_with_events(1).replace("SUMMARY:Event 0", "SUMMARY:Renamed")
    upstream.routes["/cal.ics"] = ics(two, etag='"v2"')
    third = await sync(ext_api, user, key)
    assert third.result is not None and third.result.pop("fetched_at")
    assert third.result == {"status": "synced", "imported": 0, "updated": 1, "skipped": 0, "removed": 2}
    assert await event_uids(ext_api, user, key) == ["evt-0@test"]
    # Idempotent: the same file again (forced past the 304) changes nothing.
    again = await sync(ext_api, user, key, "?force=true")
    assert again.result is not None and again.result.pop("fetched_at")
    assert again.result == {"status": "synced", "imported": 0, "updated": 0, "skipped": 1, "removed": 0}


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (status(404), "the server answered 404 Not Found"),
        (lambda _: Reply(200, b"<html>hi</html>", {"Content-Type": "text/html"}), "HTML page"),
        (lambda _: Reply(200, b"hello", {"Content-Type": "text/plain"}), "not an iCalendar file"),
        (lambda _: Reply(200, b"x" * 200_000, content_length=False), "larger than 65536 bytes"),
        (lambda _: Reply(200, b"x" * 200_000), "larger than 65536 bytes"),
        (status(302, Location="http://10.0.0.1/internal.ics"), "redirected to a refused URL: the address 10.0.0.1"),
        (status(302, Location="http://169.254.169.254/"), "link-local"),
        (status(302, Location="/cal.ics"), "more than 5 redirects"),
    ],
    ids=["404", "html", "not-ics", "too-large-streamed", "too-large-declared", "redirect-private",
         "redirect-metadata", "redirect-loop"],
)
async def test_a_permanent_error_fails_at_once_and_is_stored(
    ext_api: Api, upstream: Upstream, user: str, reply: Handler, message: str
) -> None:
    upstream.routes["/good.ics"] = ics(ics_with_events(2))
    key = (await subscribe(ext_api, user, upstream.url("/good.ics")))["key"]
    assert (await sync(ext_api, user, key)).status is JobStatus.SUCCESS
    # The same URL now answers badly: the events stay as they were.
    upstream.routes["/good.ics"] = reply
    upstream.routes["/cal.ics"] = reply
    state = await sync(ext_api, user, key)
    assert state.status is JobStatus.FAILURE and state.attempts == 1, (state.error, state.attempts)
    assert state.error is not None and message in state.error and "PermanentFetchError" in state.error
    view = await external(ext_api, user, key)
    assert view["last_status"] == "error" and message in view["last_error"], view
    assert len(await event_uids(ext_api, user, key)) == 2


@pytest.mark.parametrize(
    "first",
    [status(500), status(503), status(429, Retry_After="1"),
     lambda _: Reply(200, ics_with_events(1).encode(), stall_s=1.5)],
    ids=["500", "503", "429", "stall"],
)
async def test_retryable_errors_are_retried(ext_api: Api, upstream: Upstream, user: str, first: Handler) -> None:
    upstream.routes["/flaky.ics"] = [first, ics(ics_with_events(2))]
    key = (await subscribe(ext_api, user, upstream.url("/flaky.ics")))["key"]
    state = await sync(ext_api, user, key)
    assert state.status is JobStatus.SUCCESS and state.attempts == 2, (state.error, state.attempts)
    assert (await external(ext_api, user, key))["last_status"] == "synced"
    assert len(await event_uids(ext_api, user, key)) == 2


async def test_a_flapping_server_fails_once_retries_are_spent(ext_api: Api, upstream: Upstream, user: str) -> None:
    # Threshold 2 in these tests: two 500s open the circuit, the last attempts fail fast.
    upstream.routes["/down.ics"] = status(500)
    key = (await subscribe(ext_api, user, upstream.url("/down.ics")))["key"]
    state = await sync(ext_api, user, key)
    assert state.status is JobStatus.FAILURE and state.attempts == 4
    assert len(upstream.hits("/down.ics")) == 2
    assert state.error is not None and "ConnectionCoolingDown" in state.error
    assert "cooling down" in (await external(ext_api, user, key))["last_error"]


async def test_the_guard_cools_a_host_down_for_every_calendar_on_it(
    ext_api: Api, upstream: Upstream, user: str, other_user: str
) -> None:
    upstream.routes["/down.ics"] = status(503)
    upstream.routes["/ok.ics"] = ics(ics_with_events(1))
    broken = (await subscribe(ext_api, user, upstream.url("/down.ics")))["key"]
    assert (await sync(ext_api, user, broken)).status is JobStatus.FAILURE
    guard = await ext_api.runtime.ics_guard.state("ics:127.0.0.1")
    assert guard.state.value == "open" and guard.retry_after_s > 30

    # Another calendar on the same host: refused at once, nothing sent.
    same_host = (await subscribe(ext_api, other_user, upstream.url("/ok.ics")))["key"]
    state = await sync(ext_api, other_user, same_host)
    assert state.status is JobStatus.FAILURE and "ConnectionCoolingDown" in (state.error or "")
    assert upstream.hits("/ok.ics") == []
    # The same server under another host name is another connection: it syncs.
    other_host = (await subscribe(ext_api, other_user, upstream.url("/ok.ics", host="localhost")))["key"]
    synced = await sync(ext_api, other_user, other_host)
    assert synced.status is JobStatus.SUCCESS, synced.error
    assert len(upstream.hits("/ok.ics")) == 1

    # What an operator sees, and the reset that lets the host be tried again at once.
    root = ext_api.headers("root", admin=True)
    assert (await ext_api.client.get("/admin/guards", headers=ext_api.headers(user))).status_code == 403
    guards = (await (await ext_api.client.get("/admin/guards", headers=root)).get_json())["guards"]
    listed = {g["name"]: g for g in guards}
    host = listed["ics:127.0.0.1"]
    assert host["state"] == "open" and host["failures"] == 2 and host["retry_after_s"] > 30
    assert host["last_error"] and host["cooldown_until"] > host["observed_at"]
    response = await ext_api.client.post("/admin/guards/ics:127.0.0.1/reset", headers=root)
    assert response.status_code == 200
    reset = await response.get_json()
    assert reset["state"] == "closed" and reset["failures"] == 0 and reset["cooldown_until"] is None
    assert (await sync(ext_api, other_user, same_host)).status is JobStatus.SUCCESS
    assert (await ext_api.client.post("/admin/guards/x/reset", headers=ext_api.headers(user))).status_code == 403


# --- revalidation in the worker -------------------------------------------------------------------------------


async def test_a_queued_sync_of_a_deleted_calendar_is_canceled_unfetched(
    ext_api: Api, upstream: Upstream, user: str
) -> None:
    upstream.routes["/cal.ics"] = ics(ics_with_events(1))
    key = (await subscribe(ext_api, user, upstream.url("/cal.ics")))["key"]
    job_id = await start_sync(ext_api, user, key)
    assert (await ext_api.client.delete(f"/calendars/{key}", headers=ext_api.headers(user))).status_code == 204
    await ext_api.drain()
    state = await ext_api.state(job_id)
    assert state.status is JobStatus.CANCELED and "AccessRevoked" in (state.error or "")
    assert upstream.seen == []


async def test_a_queued_sync_of_a_calendar_that_changed_hands_is_canceled_unfetched(
    ext_api: Api, upstream: Upstream, user: str, other_user: str
) -> None:
    upstream.routes["/cal.ics"] = ics(ics_with_events(1))
    key = (await subscribe(ext_api, user, upstream.url("/cal.ics")))["key"]
    job_id = await start_sync(ext_api, user, key)
    async with ext_api.runtime.engine.begin() as conn:
        await conn.execute(text("UPDATE calendars SET owner_uid = :o WHERE key = :k"), {"o": other_user, "k": key})
    await ext_api.drain()
    state = await ext_api.state(job_id)
    assert state.status is JobStatus.CANCELED and "AccessRevoked" in (state.error or "")
    assert upstream.seen == []


async def test_one_sync_in_flight_per_user(ext_api: Api, user: str) -> None:
    key = (await subscribe(ext_api, user, "http://127.0.0.1:1/cal.ics"))["key"]
    await start_sync(ext_api, user, key)
    response = await ext_api.client.post(f"/calendars/{key}/sync", headers=ext_api.headers(user))
    assert response.status_code == 409 and (await response.get_json())["error"] == "job_concurrent_limit"


# --- the fetcher alone ---------------------------------------------------------------------------------------


async def test_the_fetcher_reports_retry_after_and_sends_conditional_headers(upstream: Upstream) -> None:
    policy = FetchPolicy(allow_hosts=frozenset(ALLOW), timeout_s=1.0)
    upstream.routes["/limited"] = status(429, Retry_After="7")
    with pytest.raises(RetryableFetchError) as limited:
        await fetch_ics(upstream.url("/limited"), policy)
    assert limited.value.kind is FetchErrorKind.RATE_LIMITED and limited.value.retry_after_s == 7.0
    assert "retry after 7s" in str(limited.value)
    upstream.routes["/busy"] = status(503, Retry_After="3")
    with pytest.raises(RetryableFetchError) as busy:
        await fetch_ics(upstream.url("/busy"), policy)
    assert busy.value.kind is FetchErrorKind.SERVER_ERROR and busy.value.retry_after_s == 3.0
    upstream.routes["/broken"] = status(500, Retry_After="3")  # only 429 and 503 say when to come back
    with pytest.raises(RetryableFetchError) as broken:
        await fetch_ics(upstream.url("/broken"), policy)
    assert broken.value.retry_after_s is None
    upstream.routes["/cal.ics"] = lambda _: Reply(304)
    stamp = "Mon, 01 Jan 2030 00:00:00 GMT"
    result = await fetch_ics(upstream.url("/cal.ics"), policy, etag='"e"', last_modified=stamp)
    assert result.not_modified and result.etag == '"e"'
    sent = upstream.hits("/cal.ics")[-1]
    assert sent["if-none-match"] == '"e"' and sent["if-modified-since"] == stamp
    # Without the allow list the same server is refused before anything is sent.
    before = len(upstream.seen)
    with pytest.raises(PermanentFetchError) as refused:
        await fetch_ics(upstream.url("/cal.ics"), FetchPolicy())
    assert refused.value.kind is FetchErrorKind.REFUSED_ADDRESS and len(upstream.seen) == before


async def test_the_transport_connects_to_the_checked_address_keeping_host_and_sni() -> None:
    """DNS rebinding: the request goes to the IP that was checked, with the original Host and SNI."""
    import httpx

    sent: list[httpx.Request] = []

    class Recorder(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            sent.append(request)
            return httpx.Response(200, content=b"BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n")

    policy = FetchPolicy(allow_hosts=frozenset({"localhost"}))
    result = await fetch_ics("https://localhost:8443/feed.ics", policy, transport=Recorder())
    assert result.body is not None and not result.not_modified
    (request,) = sent
    assert request.url.host == "127.0.0.1" and request.url.port == 8443 and request.url.scheme == "https"
    assert request.headers["Host"] == "localhost:8443"
    assert request.extensions["sni_hostname"] == "localhost"
    # And the checker itself never lets a non-public address through, mapped or not.
    import ipaddress

    for address in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "10.1.2.3", "fd00::1", "fe80::1", "169.254.169.254",
                    "224.0.0.1", "0.0.0.0", "100.64.0.1", "192.0.2.1"):
        assert address_refusal(ipaddress.ip_address(address)) is not None, address
    assert address_refusal(ipaddress.ip_address("93.184.216.34")) is None
    await asyncio.sleep(0)


def test_the_fetch_settings_are_read_from_the_environment() -> None:
    env = {"AGENT_FETCH_ALLOW_HOSTS": " 127.0.0.1, Feeds.LAN ,", "AGENT_ICS_COOLDOWN_SECONDS": "5",
           "AGENT_ICS_SWEEP_MAX_IN_FLIGHT": "3"}
    settings = AppSettings.from_env(env)
    assert settings.fetch_allow_hosts == ("127.0.0.1", "feeds.lan") and settings.ics_cooldown_s == 5.0
    assert settings.ics_sweep_max_in_flight == 3
    assert AppSettings.from_env({}).fetch_allow_hosts == ()
    assert AppSettings.from_env({}).ics_sweep_max_in_flight == 10
    for bad in ({"AGENT_FETCH_TIMEOUT_SECONDS": "0"}, {"AGENT_ICS_FAILURE_THRESHOLD": "0"},
                {"AGENT_FETCH_MAX_BYTES": "10"}, {"AGENT_ICS_MIN_INTERVAL_SECONDS": "soon"},
                {"AGENT_ICS_SWEEP_MAX_IN_FLIGHT": "0"}, {"AGENT_ICS_SWEEP_MAX_IN_FLIGHT": "many"}):
        with pytest.raises(ConfigurationError, match=next(iter(bad))):
            AppSettings.from_env(bad)


# --- the periodic sweep ---------------------------------------------------------------------------------------


async def _set_last_sync(api: Api, when: datetime, key: str | None = None) -> None:
    """As if the calendar(s) had last synced at `when` with the default interval (60 minutes)."""
    statement = "UPDATE calendar_external_sources SET last_sync_at = :at, next_sync_at = :next" + (
        " WHERE calendar_key = :k" if key else ""
    )
    at = when.astimezone(UTC).replace(tzinfo=None)
    async with api.runtime.engine.begin() as conn:
        await conn.execute(text(statement), {"at": at, "next": at + timedelta(minutes=60), "k": key})


async def _sweep(api: Api) -> dict[str, Any]:
    job_id = await api.runtime.client.enqueue(JobRequestSyncExternalAuto())
    await api.drain()
    state = await api.state(job_id)
    assert state.status is JobStatus.SUCCESS and state.result is not None, state.error
    return state.result


async def test_the_sweep_fans_out_due_calendars_and_records_the_run(
    ext_api: Api, upstream: Upstream, user: str, other_user: str
) -> None:
    upstream.routes["/a.ics"] = ics(ics_with_events(2), etag='"a1"')
    upstream.routes["/b.ics"] = ics(ics_with_events(1, prefix="b"))
    upstream.routes["/gone.ics"] = status(404)
    a = (await subscribe(ext_api, user, upstream.url("/a.ics")))["key"]
    assert (await sync(ext_api, user, a)).status is JobStatus.SUCCESS
    # Only this test's calendars are due: every other one in the shared database was "just synced".
    await _set_last_sync(ext_api, datetime.now(UTC))
    await _set_last_sync(ext_api, datetime.now(UTC) - timedelta(hours=2), a)  # due again: a 304
    b = (await subscribe(ext_api, other_user, upstream.url("/b.ics")))["key"]  # never synced: due
    bad = (await subscribe(ext_api, user, upstream.url("/gone.ics")))["key"]

    result = await _sweep(ext_api)
    assert result["due"] == 3 and result["group_id"]
    record = await ext_api.runtime.agent.runs.get(result["run_id"])
    assert record is not None and record.kind == SWEEP_RUN_KIND
    assert record.status is RunStatus.PARTIAL, record
    assert record.counters == {"due": 3, "synced": 1, "unchanged": 1, "failed": 1}
    assert list(record.failed_ids) == [bad]
    assert (await external(ext_api, user, a))["last_status"] == "unchanged"
    assert (await external(ext_api, other_user, b))["last_status"] == "synced"
    assert await event_uids(ext_api, other_user, b) == ["b-0@test"]
    assert (await external(ext_api, user, bad))["last_status"] == "error"

    # Nothing due any more (a failed sync waits its interval too): an empty successful run, nothing queued.
    empty = await _sweep(ext_api)
    assert empty == {"run_id": empty["run_id"], "due": 0, "group_id": None}
    record = await ext_api.runtime.agent.runs.get(empty["run_id"])
    assert record is not None and record.status is RunStatus.SUCCESS
    assert record.counters == {"due": 0, "synced": 0, "unchanged": 0, "failed": 0}


async def test_due_calendars_come_from_the_index_longest_waiting_first(ext_api: Api, user: str) -> None:
    repository = CalendarRepository(ext_api.runtime.engine)
    keys = [(await subscribe(ext_api, user, f"http://127.0.0.1/{n}.ics"))["key"] for n in range(4)]
    now = datetime.now(UTC)
    await _set_last_sync(ext_api, now)  # every other calendar of the shared database: not due
    await _set_last_sync(ext_api, now - timedelta(hours=3), keys[1])
    await _set_last_sync(ext_api, now - timedelta(hours=2), keys[2])
    async with ext_api.runtime.engine.begin() as conn:  # keys[3] never synced: due first
        await conn.execute(text("UPDATE calendar_external_sources SET last_sync_at = NULL, next_sync_at = NULL"
                                " WHERE calendar_key = :k"), {"k": keys[3]})
    due = await repository.due_external(now, limit=10)
    assert [c.key for c in due] == [keys[3], keys[1], keys[2]]
    assert due[0].owner_uid == user and due[0].url == "http://127.0.0.1/3.ics"
    assert [c.key for c in await repository.due_external(now, limit=2)] == [keys[3], keys[1]]
    # A longer interval moves the next sync: keys[2] (synced 2 h ago) is not due with 180 minutes.
    response = await ext_api.client.patch(f"/calendars/{keys[2]}/external", json={"sync_interval_minutes": 180},
                                          headers=ext_api.headers(user))
    assert response.status_code == 200
    assert [c.key for c in await repository.due_external(now, limit=10)] == [keys[3], keys[1]]
    await _set_last_sync(ext_api, now)  # leave nothing due for the next test on this database


async def test_concurrent_syncs_on_sqlite_queue_for_the_write_lock(tmp_path: Path) -> None:
    """A plain BEGIN reads, then fails to upgrade to a write once another sync has committed
    ("database is locked", not covered by busy_timeout): 11 of 12 failed before writes began IMMEDIATE."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'race.db'}"
    upgrade(url)
    engine = create_app_engine(url)
    try:
        repository = CalendarRepository(engine)
        keys = [(await repository.create_external_calendar("u", f"c{n}", f"http://h/{n}.ics", 60))[0].key
                for n in range(12)]
        start = datetime(2030, 1, 1, 9, tzinfo=UTC)
        events = [Event(uid=f"e{n}@race", summary="s", start=start, end=start + timedelta(hours=1))
                  for n in range(30)]
        results = await asyncio.gather(*(
            repository.apply_sync(key, "u", events, at=datetime.now(UTC), etag=None, last_modified=None)
            for key in keys
        ), return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert all(r is not None and r.imported == 30 for r in results)
    finally:
        await engine.dispose()


def test_the_sweep_takes_hosts_in_turn() -> None:
    due = [DueCalendar(key=f"{host}{n}", owner_uid="u", url=f"https://{host}.example/{n}.ics")
           for host, count in (("a", 3), ("b", 1), ("c", 2)) for n in range(count)]
    assert [c.key for c in interleave_hosts(due)] == ["a0", "b0", "c0", "a1", "c1", "a2"]
    assert interleave_hosts([]) == []


async def test_a_sweep_is_skipped_and_recorded_while_the_previous_one_runs(ext_api: Api) -> None:
    await _set_last_sync(ext_api, datetime.now(UTC))  # nothing due: the sweeps below fan out nothing
    runs = ext_api.runtime.agent.runs
    going = await runs.start(SWEEP_RUN_KIND, triggered_by=RunTrigger.SCHEDULED)  # its group still running
    result = await _sweep(ext_api)
    assert result["skipped_for"] == going.run_id and result["group_id"] is None
    skipped = await runs.get(result["run_id"])
    assert skipped is not None and skipped.status is RunStatus.SKIPPED
    assert skipped.error is not None and going.run_id in skipped.error
    assert (await runs.get(going.run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
    await runs.finish(going.run_id, RunStatus.SUCCESS)
    after = await _sweep(ext_api)
    assert "skipped_for" not in after
    assert (await runs.get(after["run_id"])).status is RunStatus.SUCCESS  # type: ignore[union-attr]


async def test_an_admin_starts_a_sweep_and_reads_the_runs(ext_api: Api, user: str) -> None:
    await _set_last_sync(ext_api, datetime.now(UTC))
    root = ext_api.headers("root", admin=True)
    assert (await ext_api.client.post("/admin/sync/external", headers=ext_api.headers(user))).status_code == 403
    response = await ext_api.client.post("/admin/sync/external", headers=root)
    assert response.status_code == 202
    job_id = (await response.get_json())["job_id"]
    # One sweep job at a time, whoever asks: the scheduled ticks share the gate.
    again = await ext_api.client.post("/admin/sync/external", headers=root)
    assert again.status_code == 409 and (await again.get_json())["error"] == "job_concurrent_limit"
    await ext_api.drain()
    assert (await ext_api.state(job_id)).status is JobStatus.SUCCESS
    await _sweep(ext_api)  # a scheduled-style one (no requester)

    response = await ext_api.client.get(f"/admin/runs?kind={SWEEP_RUN_KIND}&limit=1", headers=root)
    assert response.status_code == 200
    first = await response.get_json()
    assert len(first["runs"]) == 1 and first["next"]
    newest = first["runs"][0]
    assert newest["triggered_by"] == "scheduled" and newest["user_uid"] is None
    assert newest["status"] == "success" and newest["duration_s"] >= 0
    second = await (await ext_api.client.get(
        f"/admin/runs?kind={SWEEP_RUN_KIND}&limit=1&before={first['next']}", headers=root
    )).get_json()
    manual = second["runs"][0]
    assert manual["triggered_by"] == "manual" and manual["user_uid"] == "root" and manual["job_id"] == job_id
    assert second["next"] is None
    one = await ext_api.client.get(f"/admin/runs/{manual['run_id']}", headers=root)
    assert (await one.get_json()) == manual
    filtered = await (await ext_api.client.get("/admin/runs?status=partial", headers=root)).get_json()
    assert filtered == {"runs": [], "next": None}
    for query in ("status=done", "limit=0", "limit=101", "before=junk", "kind=", "color=red"):
        bad = await ext_api.client.get(f"/admin/runs?{query}", headers=root)
        assert bad.status_code == 422, query
    assert (await ext_api.client.get("/admin/runs", headers=ext_api.headers(user))).status_code == 403
    assert (await ext_api.client.get(f"/admin/runs/{'0' * 32}", headers=root)).status_code == 404
    assert (await ext_api.client.get("/admin/runs/not-an-id", headers=root)).status_code == 404


async def test_an_admin_cancels_a_running_sweep_and_its_group(
    ext_api: Api, upstream: Upstream, user: str
) -> None:
    upstream.routes["/queued.ics"] = ics(ics_with_events(1))
    keys = [(await subscribe(ext_api, user, upstream.url("/queued.ics")))["key"] for _ in range(3)]
    runs, client = ext_api.runtime.agent.runs, ext_api.runtime.client
    # A sweep as its job leaves it: the run recorded, the group created, no child run yet.
    record = await runs.start(SWEEP_RUN_KIND, triggered_by=RunTrigger.SCHEDULED)
    children = [JobRequestSyncExternal(calendar_key=key, owner_uid=user) for key in keys]
    finalizer = JobRequestSyncExternalDone(run_id=record.run_id, started_at=datetime.now(UTC).isoformat(),
                                           calendar_keys=keys)
    group_id = await client.enqueue_group(children, finalizer, max_in_flight=1)
    await runs.heartbeat(record.run_id, group_id=group_id)

    root = ext_api.headers("root", admin=True)
    assert (await ext_api.client.post(f"/admin/runs/{record.run_id}/cancel",
                                      headers=ext_api.headers(user))).status_code == 403
    response = await ext_api.client.post(f"/admin/runs/{record.run_id}/cancel", headers=root)
    assert response.status_code == 200
    cancelled = await response.get_json()
    assert cancelled["status"] == "cancelled" and cancelled["error"] == "cancelled by root"
    assert cancelled["group_id"] == group_id
    again = await ext_api.client.post(f"/admin/runs/{record.run_id}/cancel", headers=root)
    assert again.status_code == 409 and (await again.get_json())["error"] == "run_not_running"

    await ext_api.drain()  # the finalizer still runs; the run keeps its first outcome
    view = await client.get_group(group_id)
    assert view is not None and view.canceled == 3 and view.succeeded == 0
    assert upstream.hits("/queued.ics") == []
    assert (await runs.get(record.run_id)).status is RunStatus.CANCELLED  # type: ignore[union-attr]


async def test_the_sweep_is_a_schedule_every_five_minutes(api: Api) -> None:
    response = await api.client.get("/admin/schedules", headers=api.headers("root", admin=True))
    schedules = {s["name"]: s for s in (await response.get_json())["schedules"]}
    sweep = schedules[JobRequestSyncExternalAuto.name]
    assert sweep["default_cron"] == "*/5 * * * *" and sweep["enabled"] is True
