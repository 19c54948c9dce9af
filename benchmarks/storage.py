"""Benchmark of the blob store: 64 MB save/load per backend vs. the bare driver, and streaming memory.

Run: `.venv/bin/python benchmarks/storage.py` (PostgreSQL/MariaDB from AGENT_TEST_POSTGRES_URL /
AGENT_TEST_MARIADB_URL, skipped with a note when unreachable). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiomysql  # noqa: E402
import aiosqlite  # noqa: E402
import asyncpg  # noqa: E402
from sqlalchemy.engine import URL, make_url  # noqa: E402

from agent_async.storage import ClientStorageDatabase, upgrade_async  # noqa: E402
from agent_async.storage.testing import scratch_database  # noqa: E402

BLOB_BYTES = 64 * 1024 * 1024
MB = 1024 * 1024
CHUNK_BYTES = 1024 * 1024  # AgentSettings.storage_chunk_bytes default
RUNS = 3  # best of RUNS: the first run of each kind also pays for cold caches
SOURCE = "bench"
SERVERS = {
    "postgresql": ("AGENT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    "mariadb": ("AGENT_TEST_MARIADB_URL", "mysql+aiomysql://root@127.0.0.1:3306/test"),
}
TARGET_STREAM_RSS_MB = 16
TARGET_RATIO = 0.5


async def best_seconds(action: Callable[[], Awaitable[Any]]) -> float:
    best = float("inf")
    for _ in range(RUNS):
        started = time.perf_counter()
        await action()
        best = min(best, time.perf_counter() - started)
    return best


# -- bare drivers: the whole blob in ONE statement --------------------------------------------------


async def bare_postgresql(url: URL, data: bytes) -> tuple[float, float, str]:
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    setup = await asyncpg.connect(dsn)
    await setup.execute("CREATE TABLE IF NOT EXISTS bench_bare (id int PRIMARY KEY, b bytea)")
    await setup.close()

    async def save() -> None:
        conn = await asyncpg.connect(dsn)
        await conn.execute("DELETE FROM bench_bare")
        await conn.execute("INSERT INTO bench_bare VALUES (1, $1)", data)
        await conn.close()

    async def load() -> None:
        conn = await asyncpg.connect(dsn)
        got = await conn.fetchval("SELECT b FROM bench_bare WHERE id = 1")
        await conn.close()
        if len(got) != len(data):
            raise RuntimeError("bare PostgreSQL read returned the wrong size")

    return await best_seconds(save), await best_seconds(load), "asyncpg INSERT $1 / SELECT"


def _mysql_kwargs(url: URL) -> dict[str, Any]:
    return {
        "host": url.host or "127.0.0.1",
        "port": url.port or 3306,
        "user": url.username or "root",
        "password": url.password or "",
        "db": url.database,
    }


async def bare_mariadb(url: URL, data: bytes) -> tuple[float, float, str]:
    kwargs = _mysql_kwargs(url)
    admin = await aiomysql.connect(**kwargs, autocommit=True)
    cursor = await admin.cursor()
    await cursor.execute("SELECT @@GLOBAL.max_allowed_packet")
    (original,) = await cursor.fetchone()
    # One statement carrying 64 MB (escaped: up to 128 MB) needs a larger packet for this test only.
    await cursor.execute("SET GLOBAL max_allowed_packet = %s", (512 * MB,))
    await cursor.execute("CREATE TABLE IF NOT EXISTS bench_bare (id INT PRIMARY KEY, b LONGBLOB)")
    try:

        async def save() -> None:
            conn = await aiomysql.connect(**kwargs)
            cur = await conn.cursor()
            await cur.execute("DELETE FROM bench_bare")
            await cur.execute("INSERT INTO bench_bare VALUES (1, %s)", (data,))
            await conn.commit()
            conn.close()

        async def load() -> None:
            conn = await aiomysql.connect(**kwargs)
            cur = await conn.cursor()
            await cur.execute("SELECT b FROM bench_bare WHERE id = 1")
            (got,) = await cur.fetchone()
            conn.close()
            if len(got) != len(data):
                raise RuntimeError("bare MariaDB read returned the wrong size")

        timings = await best_seconds(save), await best_seconds(load)
    finally:
        await cursor.execute("SET GLOBAL max_allowed_packet = %s", (original,))
        admin.close()
    note = f"aiomysql INSERT %s / SELECT with max_allowed_packet raised to 512 MB, restored to {original}"
    return timings[0], timings[1], note


async def bare_sqlite(url: URL, data: bytes) -> tuple[float, float, str]:
    path = str(url.database).replace("blobs.db", "bare.db")
    async with aiosqlite.connect(path) as conn:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_bare (id INTEGER PRIMARY KEY, b BLOB)")
        await conn.commit()

    async def save() -> None:
        async with aiosqlite.connect(path) as conn:
            await conn.execute("DELETE FROM bench_bare")
            await conn.execute("INSERT INTO bench_bare VALUES (1, ?)", (data,))
            await conn.commit()

    async def load() -> None:
        async with aiosqlite.connect(path) as conn:
            cursor = await conn.execute("SELECT b FROM bench_bare WHERE id = 1")
            row = await cursor.fetchone()
            if row is None or len(row[0]) != len(data):
                raise RuntimeError("bare SQLite read returned the wrong size")

    return await best_seconds(save), await best_seconds(load), "aiosqlite INSERT ? / SELECT (WAL)"


BARE = {"sqlite": bare_sqlite, "postgresql": bare_postgresql, "mariadb": bare_mariadb}


# -- the store ------------------------------------------------------------------------------------


async def store_timings(url: URL, data: bytes) -> tuple[float, float, str]:
    store = ClientStorageDatabase(SOURCE, database_url=url, chunk_bytes=CHUNK_BYTES)
    refs: list[str] = []

    async def save() -> None:
        refs.append(await store.save(data, "application/octet-stream"))

    async def load() -> None:
        loaded = await store.load(refs[-1])
        if loaded is None or len(loaded[0]) != len(data):
            raise RuntimeError("store returned the wrong blob")

    save_s = await best_seconds(save)
    load_s = await best_seconds(load)
    for ref in refs[:-1]:
        await store.delete(ref)
    await store.close()
    return save_s, load_s, refs[-1]


def child_rss_growth_mb(url: URL, ref: str, mode: str) -> float:
    """Peak RSS growth of a fresh process reading `ref` (stream or load), so nothing else pollutes it."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--url", url.render_as_string(hide_password=False),
         "--ref", ref],
        capture_output=True, text=True, timeout=600, check=True,
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rss_growth_mb"])


def peak_rss_kb() -> int:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent
    across fork+exec, which would hide the child's own peak behind the benchmark's."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


async def child(mode: str, url: str, ref: str) -> None:
    store = ClientStorageDatabase(SOURCE, database_url=url, chunk_bytes=CHUNK_BYTES)
    stream = await store.open(ref)  # connects once, so driver buffers are part of the baseline
    if stream is None:
        raise SystemExit("blob not found")
    before_kb = peak_rss_kb()
    total = 0
    if mode == "stream":
        async for chunk in stream.iter_chunks():
            total += len(chunk)
    else:
        loaded = await store.load(ref)
        total = len(loaded[0]) if loaded else 0
    after_kb = peak_rss_kb()
    await store.close()
    if total != stream.size_bytes:
        raise SystemExit(f"read {total} bytes, expected {stream.size_bytes}")
    print(json.dumps({"rss_growth_mb": round((after_kb - before_kb) / 1024, 2)}))


# -- orchestration --------------------------------------------------------------------------------


@asynccontextmanager
async def backend_database(backend: str) -> AsyncIterator[URL]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            url = make_url(f"sqlite+aiosqlite:///{folder}/blobs.db")
            await upgrade_async(url)
            yield url
        return
    var, default = SERVERS[backend]
    async with scratch_database(os.environ.get(var, default)) as url:
        yield url


async def bench_backend(backend: str, data: bytes) -> dict[str, Any]:
    async with backend_database(backend) as url:
        store_save_s, store_load_s, ref = await store_timings(url, data)
        bare_save_s, bare_load_s, bare_note = await BARE[backend](url, data)
        stream_rss = await asyncio.to_thread(child_rss_growth_mb, url, ref, "stream")
        load_rss = await asyncio.to_thread(child_rss_growth_mb, url, ref, "load")
    size_mb = len(data) / MB
    result = {
        "store_save_mb_s": round(size_mb / store_save_s, 1),
        "store_load_mb_s": round(size_mb / store_load_s, 1),
        "bare_save_mb_s": round(size_mb / bare_save_s, 1),
        "bare_load_mb_s": round(size_mb / bare_load_s, 1),
        "save_ratio": round(bare_save_s / store_save_s, 2),
        "load_ratio": round(bare_load_s / store_load_s, 2),
        "stream_rss_growth_mb": stream_rss,
        "load_rss_growth_mb": load_rss,
        "bare": bare_note,
    }
    print(
        f"{backend:>10}: store save {result['store_save_mb_s']:7.1f} MB/s,"
        f" load {result['store_load_mb_s']:7.1f} MB/s | bare save {result['bare_save_mb_s']:7.1f},"
        f" load {result['bare_load_mb_s']:7.1f} MB/s"
        f" | ratio save {result['save_ratio']:.2f}, load {result['load_ratio']:.2f}"
        f" | RSS growth: stream {stream_rss:.1f} MB, load {load_rss:.1f} MB"
    )
    return result


async def main(backends: list[str]) -> None:
    data = os.urandom(BLOB_BYTES)
    print(f"blob {BLOB_BYTES // MB} MB, chunk {CHUNK_BYTES // 1024} KiB, best of {RUNS} runs per figure")
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for backend in backends:
        try:
            results[backend] = await bench_backend(backend, data)
        except (OSError, asyncpg.PostgresError, aiomysql.Error, ConnectionError) as error:
            skipped[backend] = f"unavailable: {type(error).__name__}: {error}"
            print(f"{backend:>10}: skipped ({skipped[backend]})")
    missed = [
        f"{name}: {figure}"
        for name, figures in results.items()
        for figure, ok in (
            ("stream_rss_growth_mb", figures["stream_rss_growth_mb"] < TARGET_STREAM_RSS_MB),
            ("save_ratio", figures["save_ratio"] >= TARGET_RATIO),
            ("load_ratio", figures["load_ratio"] >= TARGET_RATIO),
        )
        if not ok
    ]
    print("targets met" if not missed else f"targets missed: {', '.join(missed)}")
    print(json.dumps({
        "blob_mb": BLOB_BYTES // MB,
        "chunk_bytes": CHUNK_BYTES,
        "targets": {"stream_rss_growth_mb_lt": TARGET_STREAM_RSS_MB, "ratio_ge": TARGET_RATIO},
        "backends": results,
        "skipped": skipped,
        "targets_missed": missed,
    }))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgresql", "mariadb"])
    parser.add_argument("--child", choices=["stream", "load"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--ref", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child, args.url, args.ref))
    else:
        asyncio.run(main(args.backend or ["sqlite", "postgresql", "mariadb"]))
