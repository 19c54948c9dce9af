"""The ClientStorage contract, run against SQLite, PostgreSQL and MariaDB (ClientStorageDatabase)."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import pytest
import sqlalchemy.exc
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from agent_async.errors import StorageIntegrityError
from agent_async.storage import ClientStorage, ClientStorageDatabase
from agent_async.storage.engine import configure_sqlite_engine
from agent_async.storage.reference import key_of
from tests.storage.conftest import TEST_CHUNK_BYTES, MakeStore, RunSql, sql_runner, unique_source

CHUNK = TEST_CHUNK_BYTES
HAVE_PROC = os.path.isdir("/proc/self/fd")


def blob(size_bytes: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size_bytes)


async def count_chunks(run_sql: RunSql) -> int:
    rows = await run_sql("SELECT COUNT(*) FROM agent_async_blob_chunk")
    return int(rows[0][0])


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size_bytes", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + CHUNK // 2])
async def test_save_then_load_returns_the_same_bytes_and_content_type(
    store: ClientStorageDatabase, size_bytes: int
) -> None:
    """Any size, including empty and several chunks, loads back byte-identical with its MIME type."""
    data = blob(size_bytes, seed=size_bytes)
    ref = await store.save(data, "application/pdf")
    assert await store.load(ref) == (data, "application/pdf")


async def test_reference_has_the_documented_form(store: ClientStorageDatabase) -> None:
    """save() returns `agent:file:<32 lowercase hex>`, recognised by is_reference, and unique per save."""
    refs = {await store.save(b"x", "text/plain") for _ in range(3)}
    assert len(refs) == 3
    for ref in refs:
        assert ref.startswith("agent:file:")
        assert len(ref) == len("agent:file:") + 32
        assert ClientStorage.is_reference(ref)


async def test_content_type_parameters_are_preserved(store: ClientStorageDatabase) -> None:
    """The stored MIME type comes back verbatim, parameters included."""
    ref = await store.save(b"BEGIN:VCALENDAR", 'text/calendar; method="PUBLISH"; charset=utf-8')
    assert await store.load(ref) == (b"BEGIN:VCALENDAR", 'text/calendar; method="PUBLISH"; charset=utf-8')


async def test_text_round_trip_keeps_non_ascii(store: ClientStorageDatabase) -> None:
    """save_text/load_text round-trip any Unicode text and record the charset in the content type."""
    text = "Zoë, Ελληνικά, 日本語, emoji 🗓️\r\nline 2" * 5000
    ref = await store.save_text(text, "text/calendar")
    assert await store.load_text(ref) == text
    loaded = await store.load(ref)
    assert loaded is not None
    assert loaded[1] == "text/calendar; charset=utf-8"
    assert loaded[0] == text.encode("utf-8")


async def test_text_decoded_leniently_from_non_utf8_bytes_round_trips_byte_exact(
    store: ClientStorageDatabase,
) -> None:
    """Text decoded with errors='surrogateescape' from Latin-1 bytes round-trips and stores the raw bytes."""
    raw = "Café Müller, Straße".encode("latin-1") + bytes(range(0x80, 0x100))
    text = raw.decode("utf-8", "surrogateescape")
    ref = await store.save_text(text)
    assert await store.load_text(ref) == text
    loaded = await store.load(ref)
    assert loaded is not None and loaded[0] == raw


async def test_text_saved_in_another_charset_is_decoded_with_it(store: ClientStorageDatabase) -> None:
    """save_text(charset=...) stores that encoding; load_text decodes by the stored charset parameter."""
    ref = await store.save_text("Café ÷ ½", "text/csv", charset="iso-8859-1")
    assert await store.load(ref) == ("Café ÷ ½".encode("latin-1"), "text/csv; charset=iso-8859-1")
    assert await store.load_text(ref) == "Café ÷ ½"
    raw_ref = await store.save(b"na\xefve", "text/plain; charset=windows-1252")
    assert await store.load_text(raw_ref) == "naïve"


# -- streaming -----------------------------------------------------------------------------------


@pytest.mark.parametrize("size_bytes", [0, CHUNK, 5 * CHUNK + 7])
async def test_stream_yields_bounded_chunks_in_order(store: ClientStorageDatabase, size_bytes: int) -> None:
    """open() exposes type and size; iter_chunks yields chunks of <= chunk_bytes that join to the blob."""
    data = blob(size_bytes, seed=3)
    ref = await store.save(data, "application/zip")
    stream = await store.open(ref)
    assert stream is not None
    assert (stream.content_type, stream.size_bytes) == ("application/zip", size_bytes)
    chunks = [chunk async for chunk in stream.iter_chunks()]
    assert all(0 < len(chunk) <= CHUNK for chunk in chunks)
    assert len(chunks) == -(-size_bytes // CHUNK)
    assert b"".join(chunks) == data


# -- integrity -----------------------------------------------------------------------------------


async def _tamper(run_sql: RunSql, ref: str, seq: int, data: bytes, *, fix_chunk_hash: bool) -> None:
    import hashlib

    params: dict[str, Any] = {"k": key_of(ref), "s": seq, "d": data}
    if fix_chunk_hash:
        params["h"] = hashlib.sha256(data).hexdigest()
        await run_sql(
            "UPDATE agent_async_blob_chunk SET data = :d, sha256 = :h WHERE blob_key = :k AND seq = :s",
            params,
        )
    else:
        await run_sql("UPDATE agent_async_blob_chunk SET data = :d WHERE blob_key = :k AND seq = :s", params)


async def test_tampered_chunk_fails_load_and_stream_before_its_bytes(
    store: ClientStorageDatabase, run_sql: RunSql
) -> None:
    """A chunk altered in SQL raises StorageIntegrityError; the stream stops before yielding it."""
    data = blob(4 * CHUNK, seed=5)
    ref = await store.save(data, "application/octet-stream")
    forged = bytes([data[2 * CHUNK] ^ 0xFF]) + data[2 * CHUNK + 1 : 3 * CHUNK]
    await _tamper(run_sql, ref, 2, forged, fix_chunk_hash=False)

    with pytest.raises(StorageIntegrityError):
        await store.load(ref)
    stream = await store.open(ref)
    assert stream is not None
    received: list[bytes] = []
    with pytest.raises(StorageIntegrityError, match="chunk 2"):
        async for chunk in stream.iter_chunks():
            received.append(chunk)
    assert b"".join(received) == data[: 2 * CHUNK]


async def test_consistently_forged_chunk_fails_the_whole_blob_hash(
    store: ClientStorageDatabase, run_sql: RunSql
) -> None:
    """A chunk replaced together with its own hash is still caught by the whole-blob SHA-256."""
    data = blob(3 * CHUNK, seed=6)
    ref = await store.save(data, "application/octet-stream")
    await _tamper(run_sql, ref, 1, blob(CHUNK, seed=99), fix_chunk_hash=True)

    with pytest.raises(StorageIntegrityError):
        await store.load(ref)
    stream = await store.open(ref)
    assert stream is not None
    with pytest.raises(StorageIntegrityError, match="SHA-256"):
        async for _ in stream.iter_chunks():
            pass


async def test_missing_chunk_fails_load_and_stream(store: ClientStorageDatabase, run_sql: RunSql) -> None:
    """A chunk row deleted behind the store's back is reported, never silently skipped."""
    ref = await store.save(blob(3 * CHUNK, seed=7), "application/octet-stream")
    await run_sql("DELETE FROM agent_async_blob_chunk WHERE blob_key = :k AND seq = 1", {"k": key_of(ref)})
    with pytest.raises(StorageIntegrityError):
        await store.load(ref)
    stream = await store.open(ref)
    assert stream is not None
    with pytest.raises(StorageIntegrityError, match="chunk 1 missing"):
        async for _ in stream.iter_chunks():
            pass


# -- references that do not resolve ----------------------------------------------------------------

BAD_REFERENCES: list[Any] = [
    None,
    42,
    3.5,
    b"agent:file:" + b"0" * 32,
    ["agent:file:" + "0" * 32],
    {"ref": "x"},
    "",
    "agent:file:",
    "agent:file:" + "G" * 32,
    "agent:file:" + "A" * 32,
    "agent:file:" + "0" * 31,
    "agent:file:" + "0" * 33,
    "sogo:file:" + "0" * 32,
    "agent:file:' OR '1'='1",
    "agent:file:0'; DROP TABLE agent_async_blob; --",
    "agent:file:" + "0" * 32 + "\n",
    "x" * 1_000_000,
    "agent:file:" + "0" * 32,  # well-formed but never saved
]


async def test_unknown_or_malformed_references_resolve_to_nothing(store: ClientStorageDatabase) -> None:
    """load/open/load_text return None and delete is a no-op for anything that is not a saved ref."""
    kept = await store.save(b"still here", "text/plain")
    for ref in BAD_REFERENCES:
        assert await store.load(ref) is None, ref
        assert await store.open(ref) is None, ref
        assert await store.load_text(ref) is None, ref
        await store.delete(ref)
    assert await store.load(kept) == (b"still here", "text/plain")


async def test_delete_removes_the_blob_and_its_chunks(store: ClientStorageDatabase, run_sql: RunSql) -> None:
    """After delete, the ref loads as None, its chunk rows are gone, and a second delete is a no-op."""
    ref = await store.save(blob(3 * CHUNK), "application/octet-stream")
    await store.delete(ref)
    assert await store.load(ref) is None
    assert await store.open(ref) is None
    rows = await run_sql("SELECT COUNT(*) FROM agent_async_blob_chunk WHERE blob_key = :k", {"k": key_of(ref)})
    assert rows[0][0] == 0
    await store.delete(ref)


# -- scoping -------------------------------------------------------------------------------------


async def test_another_source_can_neither_see_nor_delete_nor_purge_a_blob(make_store: MakeStore) -> None:
    """A store only reaches its own source's rows: a foreign ref loads as None and survives delete/purge."""
    owner, other = make_store(), make_store()
    ref = await owner.save(b"private", "text/plain")
    assert await other.load(ref) is None
    assert await other.open(ref) is None
    assert await other.load_text(ref) is None
    await other.delete(ref)
    assert await other.purge_older_than(0) == 0
    assert await other.list_references() == []
    assert await owner.load(ref) == (b"private", "text/plain")
    assert await owner.list_references() == [ref]


async def test_purge_deletes_only_old_blobs_of_its_own_source(make_store: MakeStore, run_sql: RunSql) -> None:
    """purge_older_than removes this source's blobs older than max_age_s and returns the count."""
    now = [1_700_000_000.0]
    source = unique_source()
    mine = make_store(source, clock=lambda: now[0])
    neighbour = make_store(clock=lambda: now[0])
    old = [await mine.save(blob(2 * CHUNK, seed=i), "application/octet-stream") for i in range(3)]
    neighbour_old = await neighbour.save(b"neighbour", "text/plain")
    now[0] += 3600
    fresh = await mine.save(b"fresh", "text/plain")
    chunks_before = await count_chunks(run_sql)

    assert await mine.purge_older_than(1800) == 3
    assert [await mine.load(ref) for ref in old] == [None, None, None]
    assert await mine.load(fresh) == (b"fresh", "text/plain")
    assert await neighbour.load(neighbour_old) == (b"neighbour", "text/plain")
    assert await count_chunks(run_sql) == chunks_before - 6
    assert await mine.purge_older_than(1800) == 0
    with pytest.raises(ValueError):
        await mine.purge_older_than(-1)


# -- connection modes ----------------------------------------------------------------------------


async def test_shared_connection_is_reused_and_never_closed(
    make_store: MakeStore, backend: str, database_url: URL
) -> None:
    """With a caller's connection the store works inside the caller's transaction and leaves it open."""
    engine = create_async_engine(database_url, poolclass=NullPool)
    if backend == "sqlite":
        configure_sqlite_engine(engine)  # documented requirement for savepoints on SQLite
    try:
        async with engine.connect() as conn:
            shared = make_store(connection=conn)
            outsider = make_store(shared.source)
            ref = await shared.save(b"committed by the store", "text/plain")
            assert not conn.closed and not conn.in_transaction()
            assert await outsider.load(ref) == (b"committed by the store", "text/plain")

            transaction = await conn.begin()
            pending = await shared.save(b"uncommitted", "text/plain")
            assert await shared.load(pending) == (b"uncommitted", "text/plain")
            assert await outsider.load(pending) is None  # proves the store ran on the caller's connection
            await transaction.rollback()
            assert await shared.load(pending) is None

            await shared.delete(ref)
            await shared.close()
            assert not conn.closed
    finally:
        await engine.dispose()


async def test_failed_save_in_callers_transaction_rolls_back_only_itself(
    make_store: MakeStore, backend: str, database_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside the caller's transaction a save runs in a SAVEPOINT: its failure undoes only its own rows."""
    engine = create_async_engine(database_url, poolclass=NullPool)
    if backend == "sqlite":
        configure_sqlite_engine(engine)
    try:
        async with engine.connect() as conn:
            shared = make_store(connection=conn)
            await conn.begin()
            earlier = await shared.save(b"earlier work", "text/plain")
            original = ClientStorageDatabase._insert_chunk

            async def failing(self: ClientStorageDatabase, *args: Any) -> None:
                await original(self, *args)
                raise RuntimeError("fails after writing a chunk")

            monkeypatch.setattr(ClientStorageDatabase, "_insert_chunk", failing)
            with pytest.raises(RuntimeError):
                await shared.save(blob(2 * CHUNK), "application/octet-stream")
            monkeypatch.undo()
            assert conn.in_transaction()
            assert await shared.list_references() == [earlier]
            chunks = await conn.exec_driver_sql("SELECT COUNT(*) FROM agent_async_blob_chunk")
            await conn.commit()
            assert await make_store(shared.source).load(earlier) == (b"earlier work", "text/plain")
            assert chunks.scalar_one() == await count_chunks(sql_runner(database_url))
            assert not conn.closed
            assert (await conn.exec_driver_sql("SELECT 1")).scalar_one() == 1
    finally:
        await engine.dispose()


async def _open_connections(backend: str, database_url: URL, run_sql: RunSql) -> int:
    if backend == "postgresql":
        rows = await run_sql(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()",
            {"db": database_url.database},
        )
        return int(rows[0][0])
    if backend == "mariadb":
        rows = await run_sql(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE db = :db AND id <> CONNECTION_ID()",
            {"db": database_url.database},
        )
        return int(rows[0][0])
    return _open_files_under(str(database_url.database))


def _open_files_under(database_path: str) -> int:
    """Open file descriptors of this process on the SQLite file (and its -wal/-shm companions)."""
    path = os.path.realpath(database_path)
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}").startswith(path))


async def test_own_connections_close_after_each_operation(
    make_store: MakeStore, backend: str, database_url: URL, run_sql: RunSql
) -> None:
    """Without a connection, no connection stays open between operations (nothing to inherit on fork)."""
    if backend == "sqlite" and not HAVE_PROC:
        pytest.skip("needs /proc to count open SQLite files")
    store = make_store()
    baseline = await _open_connections(backend, database_url, run_sql)
    ref = await store.save(blob(3 * CHUNK), "application/octet-stream")
    assert await store.load(ref) is not None
    stream = await store.open(ref)
    assert stream is not None
    assert len(b"".join([chunk async for chunk in stream.iter_chunks()])) == 3 * CHUNK
    await store.purge_older_than(3600)
    assert await _open_connections(backend, database_url, run_sql) == baseline


async def test_store_built_outside_a_loop_works_in_several_loops(database_url: URL) -> None:
    """A store constructed with no running loop holds nothing loop-bound: it works in two different loops."""
    store = await asyncio.to_thread(
        ClientStorageDatabase, unique_source(), database_url=database_url, chunk_bytes=CHUNK
    )
    ref = await asyncio.to_thread(asyncio.run, store.save(blob(2 * CHUNK), "application/octet-stream"))
    assert await store.load(ref) == (blob(2 * CHUNK), "application/octet-stream")
    await store.close()


# -- failures ------------------------------------------------------------------------------------


async def test_save_failing_after_the_first_chunk_leaves_nothing(
    store: ClientStorageDatabase, run_sql: RunSql, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that dies half way rolls back: no header, no orphan chunk rows."""
    chunks_before = await count_chunks(run_sql)
    original = ClientStorageDatabase._insert_chunk
    calls = 0

    async def failing(self: ClientStorageDatabase, *args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("disk on fire")
        await original(self, *args)

    monkeypatch.setattr(ClientStorageDatabase, "_insert_chunk", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        await store.save(blob(4 * CHUNK), "application/octet-stream")
    assert calls == 2
    assert await store.list_references() == []
    assert await count_chunks(run_sql) == chunks_before


async def test_save_cancelled_half_way_leaves_nothing(
    store: ClientStorageDatabase, run_sql: RunSql, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling the task mid-save (after a chunk is written) leaves no visible blob and no chunk rows."""
    chunks_before = await count_chunks(run_sql)
    original = ClientStorageDatabase._insert_chunk
    first_chunk_written = asyncio.Event()

    async def stalling(self: ClientStorageDatabase, *args: Any) -> None:
        await original(self, *args)
        first_chunk_written.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(ClientStorageDatabase, "_insert_chunk", stalling)
    task = asyncio.create_task(store.save(blob(4 * CHUNK), "application/octet-stream"))
    await asyncio.wait_for(first_chunk_written.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.undo()
    assert await store.list_references() == []
    assert await count_chunks(run_sql) == chunks_before


async def test_concurrent_saves_and_loads_are_all_correct(store: ClientStorageDatabase) -> None:
    """50 saves at once, then 50 loads at once: every blob comes back intact under its own ref."""
    blobs = [blob(random.Random(i).randrange(0, 3 * CHUNK), seed=i) for i in range(50)]
    refs = await asyncio.gather(*(store.save(data, f"application/x-{i}") for i, data in enumerate(blobs)))
    assert len(set(refs)) == 50
    loaded = await asyncio.gather(*(store.load(ref) for ref in refs))
    assert loaded == [(data, f"application/x-{i}") for i, data in enumerate(blobs)]


async def test_invalid_content_type_is_refused_before_writing(store: ClientStorageDatabase) -> None:
    """An empty, non-ASCII or over-long content type raises ValueError and stores nothing."""
    for bad in ["", "   ", "text/plain\n", "tëxt/plain", "x/" + "y" * 300]:
        with pytest.raises(ValueError):
            await store.save(b"data", bad)
    assert await store.list_references() == []


# -- MariaDB packet limit --------------------------------------------------------------------------


async def test_blob_larger_than_max_allowed_packet_round_trips_on_mariadb(mariadb_database: URL) -> None:
    """With max_allowed_packet at 1 MiB and chunk_bytes at 4 MiB, a 3 MiB blob still saves and loads."""
    run_sql = sql_runner(mariadb_database)
    original = int((await run_sql("SELECT @@GLOBAL.max_allowed_packet"))[0][0])
    packet_bytes = 1024 * 1024
    data = blob(3 * packet_bytes, seed=11)
    await run_sql(f"SET GLOBAL max_allowed_packet = {packet_bytes}")
    try:
        # New connections take the new global: a single statement carrying the blob is now refused.
        with pytest.raises(sqlalchemy.exc.DBAPIError):
            await run_sql("SELECT LENGTH(:b)", {"b": data})
        store = ClientStorageDatabase(unique_source(), database_url=mariadb_database, chunk_bytes=4 * packet_bytes)
        ref = await store.save(data, "application/octet-stream")
        assert await store.load(ref) == (data, "application/octet-stream")
        stream = await store.open(ref)
        assert stream is not None
        assert b"".join([chunk async for chunk in stream.iter_chunks()]) == data
        longest = await run_sql(
            "SELECT MAX(LENGTH(data)) FROM agent_async_blob_chunk WHERE blob_key = :k", {"k": key_of(ref)}
        )
        assert int(longest[0][0]) < packet_bytes
        await store.close()
    finally:
        await run_sql(f"SET GLOBAL max_allowed_packet = {original}")
