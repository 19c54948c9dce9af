"""The command line and the deployment files: demo, token, migrate, the arq CLI worker, compose.yaml."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
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
        assert conn.execute(f"SELECT version_num FROM {APP_VERSION_TABLE}").fetchall() == [("app_0001",)]


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
    assert set(services) == {"redis", "postgres", "migrate", "api", "worker"}
    for name in ("redis", "postgres", "api", "worker"):
        test = services[name]["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
    assert services["migrate"]["command"] == ["python", "-m", "app", "migrate"]
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["worker"]["command"] == ["arq", "app.worker.WorkerSettings"]
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert "ports" not in services["worker"], "workers must scale without port clashes"
    assert services["api"]["command"][:2] == ["hypercorn", "app.asgi:app"]
    for name in ("migrate", "api", "worker"):
        assert services[name]["build"] == "."
        assert "AGENT_SECRET_KEY" in services[name]["environment"]
    assert (ROOT / "Dockerfile").is_file()
