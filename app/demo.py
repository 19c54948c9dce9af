"""`python -m app demo`: migrate, start the API and a worker, then drive a scripted scenario over HTTP."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import icalendar
from redis import Redis
from redis.exceptions import RedisError

from agent_async import ConfigurationError
from app.auth import TokenSigner
from app.migrate import upgrade
from app.settings import AppSettings

__all__ = ["run_demo"]

DEMO_UID = "demo-user"
_START_TIMEOUT_S = 30.0
_JOB_TIMEOUT_S = 60.0
_POLL_S = 0.2
_STOP_TIMEOUT_S = 10.0


class DemoError(RuntimeError):
    """A scenario step did not give the expected answer."""


@dataclass
class Http:
    """A tiny JSON client on urllib (the app's install set has no HTTP client library)."""

    base_url: str
    token: str

    def call(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, Message, bytes]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read()

    def json(self, method: str, path: str, body: Any = None, *, expect: int, **kwargs: Any) -> Any:
        status, _, raw = self.call(method, path, body, **kwargs)
        if status != expect:
            raise DemoError(f"{method} {path}: expected {expect}, got {status}: {raw[:300]!r}")
        return json.loads(raw)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _check_redis(settings: AppSettings) -> None:
    client = Redis.from_url(settings.agent.redis_url, socket_connect_timeout=2)
    try:
        client.ping()
    except RedisError as exc:
        raise ConfigurationError(
            f"Redis is not reachable at AGENT_REDIS_URL ({exc}); start it (e.g. `redis-server`) and retry"
        ) from None
    finally:
        client.close()


def _spawn(args: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "app", *args], env=dict(env))


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    for proc in processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(url: str, processes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc in processes:
            if proc.poll() is not None:
                raise DemoError(f"{proc.args!r} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(_POLL_S)
    raise DemoError(f"the API did not answer at {url}/health within {_START_TIMEOUT_S:g}s")


def _wait_job(http: Http, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + _JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        view: dict[str, Any] = http.json("GET", f"/jobs/{job_id}", expect=200)
        if view["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            if view["status"] != "SUCCESS":
                raise DemoError(f"job {job_id} ended {view['status']}: {view['error']}")
            return view
        time.sleep(_POLL_S)
    raise DemoError(f"job {job_id} did not finish within {_JOB_TIMEOUT_S:g}s (is the worker running?)")


class _Feed(ThreadingHTTPServer):
    """A local ICS feed for the subscription part of the demo: one calendar, with an ETag."""

    daemon_threads = True

    def __init__(self, host: str) -> None:
        super().__init__((host, 0), _FeedHandler)
        self.body = b""
        self.etag = ""

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/team.ics"

    def publish(self, body: bytes) -> None:
        self.body, self.etag = body, f'"{hashlib.sha256(body).hexdigest()[:16]}"'


class _FeedHandler(BaseHTTPRequestHandler):
    server: _Feed

    def do_GET(self) -> None:
        if self.headers.get("If-None-Match") == self.server.etag:
            self.send_response(304)
            self.send_header("ETag", self.server.etag)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/calendar; charset=utf-8")
        self.send_header("ETag", self.server.etag)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the scenario says what happens


def scenario(http: Http, say: Any = print, feed: _Feed | None = None) -> None:
    """Create a calendar, add events, export it, fetch the ICS, import it into a second calendar;
    then, given a local feed, subscribe to it as an external calendar and sync it twice."""
    key = http.json("POST", "/calendars", {"name": "Demo calendar"}, expect=201)["key"]
    say(f"1. POST /calendars -> 201, key {key}")
    for day, summary in ((1, "Kick-off"), (2, "Design review"), (3, "Release party")):
        event = {"summary": summary, "start": f"2030-01-0{day}T09:00:00Z", "end": f"2030-01-0{day}T10:00:00Z"}
        http.json("POST", f"/calendars/{key}/events", event, expect=201)
    say("2. POST /calendars/<key>/events x3 -> 201")
    job_id = http.json("POST", f"/calendars/{key}/export", expect=202)["job_id"]
    say(f"3. POST /calendars/<key>/export -> 202, job {job_id}")
    view = _wait_job(http, job_id)
    say(f"4. GET /jobs/{job_id} -> {view['status']}, result {view['result']}")
    status, headers, ics = http.call("GET", f"/jobs/{job_id}/result?download=true")
    if status != 200:
        raise DemoError(f"GET /jobs/{job_id}/result: expected 200, got {status}")
    parsed = icalendar.Calendar.from_ical(ics)
    count = len(list(parsed.walk("VEVENT")))
    say(f"5. GET /jobs/{job_id}/result -> {len(ics)} bytes of {headers.get('Content-Type')}, {count} events")
    copy = http.json("POST", "/calendars", {"name": "Demo copy"}, expect=201)["key"]
    job_id = http.json("POST", f"/calendars/{copy}/import", ics, content_type="text/calendar", expect=202)["job_id"]
    say(f"6. POST /calendars/<copy>/import (text/calendar) -> 202, job {job_id}")
    view = _wait_job(http, job_id)
    say(f"7. GET /jobs/{job_id} -> {view['status']}, result {view['result']}")
    total = http.json("GET", f"/calendars/{copy}/events", expect=200)["total"]
    if total != count:
        raise DemoError(f"the imported calendar holds {total} events, expected {count}")
    say(f"8. GET /calendars/<copy>/events -> {total} events: the round trip is complete")
    if feed is not None:
        _subscription(http, feed, ics, count, say)


def _subscription(http: Http, feed: _Feed, ics: bytes, count: int, say: Any) -> None:
    feed.publish(ics)
    body = {"name": "Team feed", "url": feed.url, "sync_interval_minutes": 60}
    key = http.json("POST", "/calendars/external", body, expect=201)["key"]
    say(f"9. POST /calendars/external {feed.url} -> 201, key {key}")
    for step, expected in (("10", "synced"), ("11", "unchanged")):
        job_id = http.json("POST", f"/calendars/{key}/sync", expect=202)["job_id"]
        result = _wait_job(http, job_id)["result"]
        if result["status"] != expected:
            raise DemoError(f"sync {job_id}: expected {expected}, got {result}")
        say(f"{step}. POST /calendars/<key>/sync -> 202, job {job_id} -> {result['status']}, result {result}")
    external = http.json("GET", f"/calendars/{key}/external", expect=200)
    total = http.json("GET", f"/calendars/{key}/events", expect=200)["total"]
    if total != count:
        raise DemoError(f"the subscribed calendar holds {total} events, expected {count}")
    say(f"12. GET /calendars/<key>/external -> last_status {external['last_status']}, {total} events "
        "(the second sync was a 304: the feed's ETag had not changed)")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(settings: AppSettings, *, host: str, port: int, once: bool) -> int:
    """The whole demo; returns the process exit code."""
    env = dict(os.environ)
    secret = settings.secret_key
    if secret is None:
        secret = secrets.token_urlsafe(32)
        env["AGENT_SECRET_KEY"] = secret
        print("AGENT_SECRET_KEY is not set: using a random key for this demo run")
    _check_redis(settings)
    upgrade(settings.agent.database_url)
    print("migrated the database (blob store and app tables)")
    # SIGTERM (docker stop, kill) ends the demo like Ctrl-C: the children are stopped in `finally`.
    signal.signal(signal.SIGTERM, _interrupt)
    port = port or _free_port(host)
    url = f"http://{host}:{port}"
    # The subscription part fetches from a feed on this machine: loopback is refused unless allowed,
    # so the demo's own API and worker (only they) allow the feed's address.
    feed = _Feed("127.0.0.1")
    threading.Thread(target=feed.serve_forever, daemon=True).start()
    allowed = [h for h in env.get("AGENT_FETCH_ALLOW_HOSTS", "").split(",") if h.strip()]
    env["AGENT_FETCH_ALLOW_HOSTS"] = ",".join([*allowed, "127.0.0.1"])
    processes = [_spawn(["api", "--host", host, "--port", str(port)], env), _spawn(["worker"], env)]
    try:
        _wait_ready(url, processes)
        token = TokenSigner(secret, max_age_s=settings.token_max_age_s).issue(DEMO_UID)
        print(f"API: {url}  (OpenAPI: {url}/openapi.json, docs: {url}/docs)")
        print(f"token for {DEMO_UID}: {token}")
        print(f"try: curl -H 'Authorization: Bearer {token}' {url}/jobs")
        print(f"local ICS feed: {feed.url} (AGENT_FETCH_ALLOW_HOSTS=127.0.0.1 for this demo's processes)")
        scenario(Http(url, token), feed=feed)
        print("demo scenario: OK")
        if once:
            return 0
        print("serving until Ctrl-C")
        while all(proc.poll() is None for proc in processes):
            time.sleep(0.5)
        return 1
    except DemoError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(processes)
        feed.shutdown()
        feed.server_close()
