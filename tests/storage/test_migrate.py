"""Migrations: the CLI, the sync entry point inside a running loop, and the dedicated version table."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from agent_async.storage import ClientStorageDatabase, upgrade
from agent_async.storage.migrate import MIGRATIONS_DIR

ROOT = Path(__file__).resolve().parents[2]


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_cli_migrates_the_url_from_the_environment_and_is_idempotent(tmp_path: Path) -> None:
    """`python -m agent_async.storage.migrate` reads AGENT_DATABASE_URL; running it twice is harmless."""
    path = tmp_path / "new-folder" / "agent.db"
    env = {**os.environ, "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{path}", "PYTHONPATH": str(ROOT)}
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "agent_async.storage.migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    assert {"agent_async_blob", "agent_async_blob_chunk", "agent_async_alembic_version"} <= _tables(path)
    assert "alembic_version" not in _tables(path)  # leaves room for the application's own Alembic env


def test_cli_url_option_wins(tmp_path: Path) -> None:
    """--url overrides AGENT_DATABASE_URL."""
    chosen, ignored = tmp_path / "chosen.db", tmp_path / "ignored.db"
    env = {**os.environ, "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{ignored}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "agent_async.storage.migrate", "--url", f"sqlite+aiosqlite:///{chosen}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "agent_async_blob" in _tables(chosen)
    assert not ignored.exists()


async def test_sync_upgrade_works_from_inside_a_running_loop(tmp_path: Path) -> None:
    """upgrade() called from async code (a running loop) still migrates, then the store works."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'inloop.db'}"
    upgrade(url)
    store = ClientStorageDatabase("agent", database_url=url)
    ref = await store.save(b"ok", "text/plain")
    assert await store.load(ref) == (b"ok", "text/plain")
    await store.close()


def test_migration_files_ship_with_the_package() -> None:
    """The Alembic env and revisions live inside the package directory (shipped as package data)."""
    assert (MIGRATIONS_DIR / "env.py").is_file()
    assert (MIGRATIONS_DIR / "script.py.mako").is_file()
    assert list((MIGRATIONS_DIR / "versions").glob("0001_*.py"))
