"""The command line and the deployment files: demo, token, migrate, the arq CLI worker, compose.yaml."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from redis.asyncio import Redis
from sqlalchemy import Connection

from agent_async import JobStatus
from app.auth import TokenSigner
from app.db import APP_VERSION_TABLE, create_app_engine, metadata
from app.factory import create_app
from app.runtime import EXTENSION_KEY, AppRuntime
from tests.app.conftest import ROOT, SECRET, make_settings
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.slow

ARQ = Path(sys.executable).parent / "arq"


def cli_env(namespace: str, database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update(AGENT_NAMESPACE=namespace, AGENT_DATABASE_URL=database_url, AGENT_REDIS_URL=REDIS_URL,
               AGENT_SECRET_KEY=SECRET, **extra)
    return env


def run(args: list[str], env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_demo_once_runs_end_to_end(tmp_path: Path, namespace: str, redis: Redis) -> None:
    """`python -m app demo --once` migrates, starts API and worker, and completes its scenario."""
    env = cli_env(namespace, f"sqlite+aiosqlite:///{tmp_path / 'demo.db'}")
    del env["AGENT_SECRET_KEY"]  # the demo must work on a fresh machine with only Redis
    done = run([sys.executable, "-m", "app", "demo", "--once", "--port", "0"], env, timeout_s=90)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "AGENT_SECRET_KEY is not set" in out
    assert "token for demo-user: " in out and "API: http://127.0.0.1:" in out
    assert "5. GET /jobs/" in out and "3 events" in out
    assert "{'imported': 3, 'skipped': 0, 'updated': 0}" in out
    # The subscription part: a local feed synced, then a 304 the second time.
    assert "9. POST /calendars/external http://127.0.0.1:" in out
    synced = next(line for line in out.splitlines() if line.startswith("10. "))
    assert "-> synced, result {" in synced and "'imported': 3" in synced
    assert "-> unchanged, result {" in next(line for line in out.splitlines() if line.startswith("11. "))
    assert "12. GET /calendars/<key>/external -> last_status unchanged, 3 events" in out
    assert "demo scenario: OK" in out


def test_token_command_prints_a_verifiable_token(tmp_path: Path, namespace: str) -> None:
    """`python -m app token UID --admin` prints one token carrying that uid and the admin flag."""
    done = run([sys.executable, "-m", "app", "token", "carol", "--admin"],
               cli_env(namespace, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"))
    assert done.returncode == 0, done.stderr
    principal = TokenSigner(SECRET, max_age_s=60).verify(done.stdout.strip())
    assert principal.uid == "carol" and principal.admin is True


def test_token_without_secret_is_a_clear_error(tmp_path: Path, namespace: str) -> None:
    """No AGENT_SECRET_KEY: exit code 2 and one line naming the variable, no traceback."""
    env = cli_env(namespace, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    del env["AGENT_SECRET_KEY"]
    done = run([sys.executable, "-m", "app", "token", "carol"], env)
    assert done.returncode == 2
    assert "AGENT_SECRET_KEY is not set" in done.stderr and "Traceback" not in done.stderr


def test_migrate_command_creates_both_schemas(tmp_path: Path, namespace: str) -> None:
    """`python -m app migrate` runs the library's storage migration and the app's, each with its version table."""
    path = tmp_path / "fresh" / "agent.db"
    done = run([sys.executable, "-m", "app", "migrate"], cli_env(namespace, f"sqlite+aiosqlite:///{path}"))
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"agent_async_blob", "agent_async_alembic_version", "calendars", "calendar_events",
                APP_VERSION_TABLE} <= tables
        assert conn.execute(f"SELECT version_num FROM {APP_VERSION_TABLE}").fetchall() == [("app_0003",)]


async def test_migrations_match_the_table_definitions(sqlite_url: str) -> None:
    """Alembic sees no difference between the migrated schema and app/module/calendar/tables.py."""
    engine = create_app_engine(sqlite_url)

    from agent_async.storage.schema import metadata as library_metadata

    library = {*library_metadata.tables, "agent_async_alembic_version", APP_VERSION_TABLE}

    def app_only(name: str | None, type_: str, parent_names: dict[str, str | None]) -> bool:
        table = name if type_ == "table" else parent_names.get("table_name")
        return table not in library

    def diff(conn: Connection) -> list[Any]:
        context = MigrationContext.configure(conn, opts={"include_name": app_only})
        return list(compare_metadata(context, metadata))

    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await engine.dispose()


async def test_arq_cli_runs_jobs_in_the_app_context(sqlite_url: str, namespace: str, redis: Redis) -> None:
    """`arq app.worker.WorkerSettings --burst` runs a job queued through the app, inside its app context."""
    app = create_app(make_settings(sqlite_url, namespace))
    runtime: AppRuntime = app.extensions[EXTENSION_KEY]
    async with app.test_app() as test_app:
        client = test_app.test_client()
        headers = {"Authorization": "Bearer " + TokenSigner(SECRET, max_age_s=60).issue("dave")}
        key = (await (await client.post("/calendars", json={"name": "Arq"}, headers=headers)).get_json())["key"]
        job_id = (await (await client.post(f"/calendars/{key}/export", headers=headers)).get_json())["job_id"]
        done = run([str(ARQ), "app.worker.WorkerSettings", "--burst"], cli_env(namespace, sqlite_url))
        assert done.returncode == 0, done.stdout + done.stderr
        state = await runtime.client.get_state(job_id)
        assert state is not None and state.status is JobStatus.SUCCESS, (state, done.stderr)
        assert state.result is not None and state.result["filename"] == "Arq.ics"


def test_compose_file_declares_the_stack() -> None:
    """compose.yaml parses and has redis, postgres, migrate, api and a scalable worker with health checks."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"redis", "postgres", "migrate", "api", "worker", "prometheus"}
    for name in ("redis", "postgres", "api", "worker"):
        test = services[name]["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
    assert services["migrate"]["command"] == ["python", "-m", "app", "migrate"]
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["worker"]["command"] == ["python", "-m", "app", "worker"]
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert "ports" not in services["worker"], "workers must scale without port clashes"
    api = services["api"]["command"]
    assert api[0] == "hypercorn" and "app.asgi:app" in api
    assert api[api.index("--config") + 1] == "python:app.hypercorn_config"
    for name in ("migrate", "api", "worker"):
        assert services[name]["build"] == "."
        assert "AGENT_SECRET_KEY" in services[name]["environment"]
    assert (ROOT / "Dockerfile").is_file()


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (no traceback, no log noise)."""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_token_with_an_empty_uid_is_a_usage_error(tmp_path: Path, namespace: str) -> None:
    env = cli_env(namespace, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    done = run([sys.executable, "-m", "app", "token", ""], env)
    assert done.returncode == 2 and done.stdout == ""
    assert "invalid uid ''" in one_error_line(done)


def test_a_sqlite_url_without_the_async_driver_is_a_usage_error(tmp_path: Path, namespace: str) -> None:
    """`sqlite:///x.db` names the synchronous driver: one line saying which URL to use instead."""
    path = tmp_path / "x.db"
    for command in ("migrate", "worker", "api"):
        done = run([sys.executable, "-m", "app", command], cli_env(namespace, f"sqlite:///{path}"))
        assert done.returncode == 2, (command, done.stderr)
        line = one_error_line(done)
        assert "AGENT_DATABASE_URL" in line and f"use sqlite+aiosqlite:///{path}" in line, line
    assert not path.exists(), "nothing was created"


def test_a_database_url_password_is_never_printed(tmp_path: Path, namespace: str) -> None:
    done = run([sys.executable, "-m", "app", "migrate"], cli_env(namespace, "postgresql://u:hunter2secret@h/db"))
    assert done.returncode == 2
    line = one_error_line(done)
    assert "hunter2secret" not in line and "postgresql+asyncpg://u:***@h/db" in line


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_api_on_a_busy_port_is_one_line_and_exit_1(tmp_path: Path, namespace: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run([sys.executable, "-m", "app", "api", "--port", str(port)],
                   cli_env(namespace, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"), timeout_s=30)
    assert done.returncode == 1
    assert one_error_line(done) == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"


def raw_get(port: int, header_bytes: int, *, finished: bool = True) -> tuple[int, dict[str, str], bytes]:
    """GET /health with a padding header of `header_bytes`, over a raw socket (no client-side limit);
    `finished=False` leaves out the blank line that ends the head, so the server reads all of it."""
    request = (f"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: {'x' * header_bytes}\r\n"
               + ("Connection: close\r\n\r\n" if finished else "")).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(OSError):  # hypercorn may answer and close before reading it all
            sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, body


def test_hypercorn_leaves_oversized_heads_to_the_app(tmp_path: Path, namespace: str, redis: Redis) -> None:
    """`python -m app api` raises hypercorn's head limit (app/hypercorn_config.py) above the app's:
    a 20 KiB header gets the app's JSON 431. hypercorn (h11) answers by itself only when a head is
    still incomplete after 64 KiB are buffered: then, before the app is called, with an empty 431
    the app cannot shape (documented in docs/api.md)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "api", "--port", str(port)],
        env=cli_env(namespace, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"), cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        for _ in range(200):
            try:
                if raw_get(port, 10)[0] == 200:
                    break
            except OSError:
                time.sleep(0.05)
        else:
            proc.terminate()
            raise AssertionError(f"the API did not start: {proc.communicate(timeout=30)[1]}")
        status, headers, body = raw_get(port, 20 * 1024)
        assert status == 431 and headers["content-type"] == "application/json"
        assert json.loads(body)["error"] == "request_header_fields_too_large"
        # Still incomplete after 64 KiB: hypercorn's own answer.
        status, headers, body = raw_get(port, 70 * 1024, finished=False)
        assert (status, headers["content-length"], body) == (431, "0", b"")
    finally:
        if proc.returncode is None:
            proc.terminate()
            proc.communicate(timeout=30)  # also closes the stderr pipe
