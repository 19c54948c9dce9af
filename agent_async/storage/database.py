"""ClientStorageDatabase: the blob store on SQLAlchemy async (PostgreSQL, MariaDB/MySQL, SQLite)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

from sqlalchemy import bindparam, delete, insert, select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_async.errors import StorageIntegrityError
from agent_async.settings import AgentSettings
from agent_async.storage.base import BlobStream, ClientStorage
from agent_async.storage.engine import create_engine, describe, parse_url, translate_errors, writing
from agent_async.storage.reference import key_of, new_key, reference_of
from agent_async.storage.schema import CONTENT_TYPE_CHARS, blob_table, chunk_table
from agent_async.storage.source import StorageSource, source_value

__all__ = ["DEFAULT_CHUNK_BYTES", "ClientStorageDatabase"]

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 1024 * 1024
MIN_CHUNK_BYTES = 1024
# Keys deleted per purge transaction: bounds the lock footprint of one sweep step.
PURGE_BATCH = 500
# Above this size the whole-blob SHA-256 runs in a thread (hashlib releases the GIL), so hashing a
# large blob neither blocks the event loop nor serialises with the copy that joins its chunks.
_THREAD_HASH_BYTES = 1024 * 1024
# MySQL drivers send a BLOB escaped (up to 2 bytes per byte) inside the INSERT text; keep this much
# of max_allowed_packet for the rest of the statement.
_MYSQL_STATEMENT_SLACK_BYTES = 16 * 1024
_MYSQL_DIALECTS = frozenset({"mysql", "mariadb"})

_CHUNK_BY_SEQ = (
    select(chunk_table.c.sha256, chunk_table.c.data)
    .where(chunk_table.c.blob_key == bindparam("key"), chunk_table.c.seq == bindparam("seq"))
)


@dataclass(frozen=True, slots=True)
class _Header:
    key: str
    content_type: str
    size_bytes: int
    sha256: str
    chunk_count: int


class _ChunkRow(NamedTuple):
    seq: int
    sha256: str
    data: bytes


class ClientStorageDatabase(ClientStorage):
    """Blobs in two tables: a header row per blob, its bytes in ordered chunks of <= `chunk_bytes`.

    Connection modes: pass a live `AsyncConnection` and every operation runs on it (inside a
    SAVEPOINT when the caller already has a transaction open) and the store never closes it;
    pass none and each operation opens its own connection from a NullPool engine, created on
    first use, and closes it when done. The constructor opens nothing.
    """

    def __init__(
        self,
        source: StorageSource | str,
        *,
        database_url: str | URL | None = None,
        connection: AsyncConnection | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if connection is not None and not isinstance(connection, AsyncConnection):
            raise TypeError(
                f"connection must be an sqlalchemy AsyncConnection, not {type(connection).__name__}"
            )
        if connection is None and database_url is None:
            raise ValueError("ClientStorageDatabase needs a database_url or a connection")
        if chunk_bytes < MIN_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be >= {MIN_CHUNK_BYTES}, got {chunk_bytes}")
        self._source = source_value(source)
        self._url = connection.engine.url if connection is not None else parse_url(database_url or "")
        self._connection = connection
        self._chunk_bytes = chunk_bytes
        self._clock = clock
        self._engine: AsyncEngine | None = None
        self._mysql_chunk_cap_bytes: int | None = None

    @classmethod
    def from_settings(
        cls, settings: AgentSettings, source: StorageSource | str, *, connection: Any = None
    ) -> Self:
        """The store for AGENT_DATABASE_URL / AGENT_STORAGE_CHUNK_BYTES; opens nothing."""
        return cls(
            source,
            database_url=settings.database_url,
            connection=connection,
            chunk_bytes=settings.storage_chunk_bytes,
        )

    @property
    def source(self) -> str:
        """The owner tag this store reads and writes."""
        return self._source

    def __repr__(self) -> str:
        mode = "shared connection" if self._connection is not None else "own connections"
        return f"<{type(self).__name__} source={self._source!r} {describe(self._url)} ({mode})>"

    # -- connections ---------------------------------------------------------------------------

    def _get_engine(self) -> AsyncEngine:
        if self._engine is None:
            self._engine = create_engine(self._url)
        return self._engine

    @asynccontextmanager
    async def _session(self, *, write: bool) -> AsyncIterator[AsyncConnection]:
        """A connection inside a transaction that commits on success and rolls back on any error."""
        if self._connection is not None:
            async with self._on_shared(self._connection, write=write) as conn:
                yield conn
            return
        with translate_errors(self._url, connecting=True):
            engine = self._get_engine()
            conn = await (writing(engine) if write else engine).connect()
        try:
            with translate_errors(self._url):
                async with conn.begin():
                    yield conn
        finally:
            await self._close_quietly(conn)

    @asynccontextmanager
    async def _on_shared(self, conn: AsyncConnection, *, write: bool) -> AsyncIterator[AsyncConnection]:
        with translate_errors(self._url):
            if not conn.in_transaction():
                async with conn.begin():
                    yield conn
            elif write:
                # The caller's transaction stays theirs: a failed save rolls back to this savepoint only.
                async with conn.begin_nested():
                    yield conn
            else:
                yield conn

    async def _close_quietly(self, conn: AsyncConnection) -> None:
        try:
            await conn.close()
        except Exception as error:  # the operation's own outcome matters more than a failed close
            logger.warning("closing storage connection to %s failed: %r", describe(self._url), error)

    async def close(self) -> None:
        """Dispose the store's own engine; a connection passed in is left open for its owner."""
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.dispose()

    # -- writes --------------------------------------------------------------------------------

    async def save(self, data: bytes, content_type: str) -> str:
        """Store `data` in one transaction: an interrupted save leaves neither header nor chunk."""
        _check_content_type(content_type)
        view = memoryview(data).cast("B")
        key = new_key()
        whole_sha256 = await _sha256_hex([view])
        async with self._session(write=True) as conn:
            chunk_bytes = await self._chunk_bytes_for(conn)
            starts = range(0, len(view), chunk_bytes)
            await conn.execute(
                insert(blob_table),
                {
                    "blob_key": key,
                    "source": self._source,
                    "content_type": content_type,
                    "size_bytes": len(view),
                    "sha256": whole_sha256,
                    "chunk_count": len(starts),
                    "created_at_ms": int(self._clock() * 1000),
                },
            )
            for seq, start in enumerate(starts):
                await self._insert_chunk(conn, key, seq, view[start : start + chunk_bytes])
        logger.debug("saved blob %s (%d bytes, source %s)", key, len(view), self._source)
        return reference_of(key)

    async def _insert_chunk(self, conn: AsyncConnection, key: str, seq: int, chunk: memoryview) -> None:
        await conn.execute(
            insert(chunk_table),
            {"blob_key": key, "seq": seq, "sha256": hashlib.sha256(chunk).hexdigest(), "data": chunk},
        )

    async def _chunk_bytes_for(self, conn: AsyncConnection) -> int:
        """The configured chunk size, lowered on MySQL so one escaped chunk fits max_allowed_packet."""
        if conn.dialect.name not in _MYSQL_DIALECTS:
            return self._chunk_bytes
        if self._mysql_chunk_cap_bytes is None:
            packet_bytes = int((await conn.execute(text("SELECT @@max_allowed_packet"))).scalar_one())
            cap = max(MIN_CHUNK_BYTES, (packet_bytes - _MYSQL_STATEMENT_SLACK_BYTES) // 2)
            self._mysql_chunk_cap_bytes = cap
            if cap < self._chunk_bytes:
                logger.info("chunk size lowered to %d bytes to fit max_allowed_packet=%d", cap, packet_bytes)
        return min(self._chunk_bytes, self._mysql_chunk_cap_bytes)

    async def delete(self, ref: object) -> None:
        """Delete one of this source's blobs; unknown, malformed or foreign references are ignored."""
        key = key_of(ref)
        if key is None:
            return
        async with self._session(write=True) as conn:
            await self._delete_keys(conn, [key])

    async def _delete_keys(self, conn: AsyncConnection, keys: Sequence[str]) -> int:
        owned = blob_table.c.blob_key.in_(keys) & (blob_table.c.source == self._source)
        deleted = (await conn.execute(delete(blob_table).where(owned))).rowcount
        if deleted:
            # SQLite does not enforce the ON DELETE CASCADE unless asked per connection: delete explicitly.
            await conn.execute(delete(chunk_table).where(chunk_table.c.blob_key.in_(keys)))
        return int(deleted)

    async def purge_older_than(self, max_age_s: float) -> int:
        """Delete this source's blobs older than `max_age_s` seconds, in batches; return the count."""
        if max_age_s < 0:
            raise ValueError(f"max_age_s must be >= 0, got {max_age_s}")
        cutoff_ms = int((self._clock() - max_age_s) * 1000)
        old = (
            select(blob_table.c.blob_key)
            .where(blob_table.c.source == self._source, blob_table.c.created_at_ms < cutoff_ms)
            .order_by(blob_table.c.created_at_ms)
            .limit(PURGE_BATCH)
        )
        purged = 0
        while True:
            async with self._session(write=True) as conn:
                keys = list((await conn.execute(old)).scalars())
                if keys:
                    purged += await self._delete_keys(conn, keys)
            if len(keys) < PURGE_BATCH:
                break
        if purged:
            logger.info("purged %d blobs older than %ss from source %s", purged, max_age_s, self._source)
        return purged

    # -- reads ---------------------------------------------------------------------------------

    async def _header(self, conn: AsyncConnection, key: str) -> _Header | None:
        row = (
            await conn.execute(
                select(
                    blob_table.c.content_type,
                    blob_table.c.size_bytes,
                    blob_table.c.sha256,
                    blob_table.c.chunk_count,
                ).where(blob_table.c.blob_key == key, blob_table.c.source == self._source)
            )
        ).first()
        if row is None:
            return None
        return _Header(key, row.content_type, int(row.size_bytes), row.sha256, int(row.chunk_count))

    async def load(self, ref: object) -> tuple[bytes, str] | None:
        """The whole blob in memory (about twice its size at peak); use `open` to stream instead."""
        key = key_of(ref)
        if key is None:
            return None
        async with self._session(write=False) as conn:
            header = await self._header(conn, key)
            if header is None:
                return None
            result = (
                await conn.execute(
                    select(chunk_table.c.seq, chunk_table.c.sha256, chunk_table.c.data)
                    .where(chunk_table.c.blob_key == key)
                    .order_by(chunk_table.c.seq)
                )
            )
            rows = [_ChunkRow(row.seq, row.sha256, row.data) for row in result]
        return await _assemble(header, rows), header.content_type

    async def open(self, ref: object) -> BlobStream | None:
        """A handle streaming the blob one chunk per query; None if `ref` is not this source's."""
        key = key_of(ref)
        if key is None:
            return None
        async with self._session(write=False) as conn:
            header = await self._header(conn, key)
        return None if header is None else DatabaseBlobStream(self, header)

    async def list_references(self, *, limit: int = 1000) -> list[str]:
        """This source's references, oldest first."""
        query = (
            select(blob_table.c.blob_key)
            .where(blob_table.c.source == self._source)
            .order_by(blob_table.c.created_at_ms, blob_table.c.blob_key)
            .limit(limit)
        )
        async with self._session(write=False) as conn:
            return [reference_of(key) for key in (await conn.execute(query)).scalars()]


class DatabaseBlobStream(BlobStream):
    """Streams a blob with one query per chunk, on one connection held for the iteration."""

    def __init__(self, store: ClientStorageDatabase, header: _Header) -> None:
        self._store = store
        self._header = header
        self.content_type = header.content_type
        self.size_bytes = header.size_bytes

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        header = self._header
        whole = hashlib.sha256()
        total_bytes = 0
        async with self._store._session(write=False) as conn:
            for seq in range(header.chunk_count):
                row = (await conn.execute(_CHUNK_BY_SEQ, {"key": header.key, "seq": seq})).first()
                if row is None:
                    raise StorageIntegrityError(
                        f"blob {header.key}: chunk {seq} missing (deleted or truncated while streaming)"
                    )
                data = bytes(row.data)
                if hashlib.sha256(data).hexdigest() != row.sha256:
                    raise StorageIntegrityError(f"blob {header.key}: chunk {seq} does not match its hash")
                whole.update(data)
                total_bytes += len(data)
                yield data
        _check_whole(header, total_bytes, whole.hexdigest())


def _check_content_type(content_type: str) -> None:
    if not isinstance(content_type, str) or not content_type.strip():
        raise ValueError("content_type must be a non-empty MIME type such as 'application/pdf'")
    if len(content_type) > CONTENT_TYPE_CHARS or not content_type.isascii() or not content_type.isprintable():
        raise ValueError(f"content_type must be printable ASCII of at most {CONTENT_TYPE_CHARS} characters")


def _check_whole(header: _Header, total_bytes: int, sha256: str) -> None:
    if total_bytes != header.size_bytes:
        raise StorageIntegrityError(
            f"blob {header.key}: {total_bytes} bytes stored, {header.size_bytes} recorded"
        )
    if sha256 != header.sha256:
        raise StorageIntegrityError(f"blob {header.key}: content does not match its SHA-256")


def _sha256_of(parts: Sequence[bytes | memoryview]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


async def _sha256_hex(parts: Sequence[bytes | memoryview]) -> str:
    if sum(len(part) for part in parts) < _THREAD_HASH_BYTES:
        return _sha256_of(parts)
    return await asyncio.to_thread(_sha256_of, parts)


async def _assemble(header: _Header, rows: Sequence[_ChunkRow]) -> bytes:
    """Join the chunks after checking order, size and the whole-blob hash (which covers every chunk)."""
    if [row.seq for row in rows] != list(range(header.chunk_count)):
        raise StorageIntegrityError(f"blob {header.key}: chunks missing or out of sequence")
    parts = [row.data for row in rows]
    # Submitted before the join so the thread hashes while this thread copies.
    hashing = asyncio.get_running_loop().run_in_executor(None, _sha256_of, parts)
    data = b"".join(parts)
    try:
        _check_whole(header, len(data), await hashing)
    except StorageIntegrityError:
        bad = [row.seq for row in rows if hashlib.sha256(row.data).hexdigest() != row.sha256]
        logger.error("blob %s failed its integrity check; bad chunks: %s", header.key, bad)
        raise
    return data
