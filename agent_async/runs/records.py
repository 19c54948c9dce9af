"""RunRecords: one SQL row per run of a job kind (who started it, how it goes, how it ended), stale cleanup."""

from __future__ import annotations

import builtins
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, RowMapping, Update, and_, exc, insert, or_, select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_async.errors import AgentError
from agent_async.runs import tables
from agent_async.runs.tables import TERMINAL_RUN_STATUSES, RunRecord, RunStatus, RunTrigger, run_table
from agent_async.settings import AgentSettings
from agent_async.storage.engine import create_engine, describe, parse_url, translate_errors, writing
from agent_async.store.codec import check_json_safe

__all__ = [
    "DEFAULT_STALE_AFTER_S", "MAX_COUNTERS_CHARS", "MAX_ERROR_CHARS", "MAX_FAILED_IDS", "MAX_FAILED_ID_CHARS",
    "MAX_LIST_LIMIT", "STALE_ERROR", "TERMINAL_RUN_STATUSES",
    "RunNotFoundError", "RunRecord", "RunRecords", "RunStatus", "RunTrigger",
]

logger = logging.getLogger(__name__)

# 45 minutes without a heartbeat: far above the pause between two heartbeats of any sane job, since
# a live run marked stale can no longer record its own outcome.
DEFAULT_STALE_AFTER_S = 2700.0
STALE_ERROR = "stale: worker lost"
# An error message is for a person reading a list of runs, not a log: the tail is cut.
MAX_ERROR_CHARS = 4000
_TRUNCATED = " [truncated]"
# Failed item ids beyond this are dropped (the counters carry the totals): a sync failing on 100,000
# items must still be able to finish its record, in a row of bounded size.
MAX_FAILED_IDS = 1000
MAX_FAILED_ID_CHARS = 255
# Counters are a few numbers; this bounds a caller that puts a whole result in them.
MAX_COUNTERS_CHARS = 16 * 1024
MAX_LIST_LIMIT = 500
_RUN_ID_RE = re.compile(r"^[0-9a-f]{32}$")
# A transaction chosen as a deadlock's victim is rolled back whole: it is run again this many times at most.
_DEADLOCK_ATTEMPTS = 3
_E = TypeVar("_E", bound=StrEnum)
_T = TypeVar("_T")


class RunNotFoundError(AgentError, LookupError):
    """No run record with this id in this namespace."""


def _name(field: str, value: object, max_chars: int) -> str:
    """An identifier: 1..max_chars printable characters (no NUL, control character or lone surrogate,
    which PostgreSQL or the drivers refuse with an obscure error)."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, got {type(value).__name__}")
    if not 0 < len(value) <= max_chars or not value.isprintable():
        raise ValueError(f"{field} must be 1 to {max_chars} printable characters, got {value[:80]!r}")
    return value


def _enum(kind: type[_E], field: str, value: object) -> _E:
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    allowed = ", ".join(member.value for member in kind)
    raise ValueError(f"{field} must be a {kind.__name__} ({allowed}), got {value!r}")


def _dumps(value: object) -> str:
    # ASCII JSON (non-ASCII escaped): NUL and lone surrogates survive every database, and the
    # stored length in characters is its length in bytes.
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def _counters(counters: object) -> str:
    if not isinstance(counters, dict):
        raise TypeError(f"counters must be a dict (a JSON object), got {type(counters).__name__}")
    check_json_safe(counters, "counters")
    encoded = _dumps(counters)
    if len(encoded) > MAX_COUNTERS_CHARS:
        raise ValueError(f"counters take {len(encoded)} characters as JSON, more than {MAX_COUNTERS_CHARS}")
    return encoded


def _failed_ids(run_id: str, failed_ids: object) -> str:
    if not isinstance(failed_ids, list | tuple):
        raise TypeError(f"failed_ids must be a list of str, got {type(failed_ids).__name__}")
    for index, item in enumerate(failed_ids):
        if not isinstance(item, str):
            raise TypeError(f"failed_ids[{index}] must be a str, got {type(item).__name__}")
        if not 0 < len(item) <= MAX_FAILED_ID_CHARS:
            raise ValueError(f"failed_ids[{index}] must be 1 to {MAX_FAILED_ID_CHARS} characters")
    if len(failed_ids) > MAX_FAILED_IDS:
        logger.warning("run %s: %d failed ids, only the first %d are kept", run_id, len(failed_ids), MAX_FAILED_IDS)
    return _dumps(list(failed_ids[:MAX_FAILED_IDS]))


def _message(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, got {type(value).__name__}")
    # PostgreSQL's text refuses NUL, and no driver can encode a lone surrogate (text decoded with
    # surrogateescape): replace both rather than lose the outcome of the run.
    text = value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - len(_TRUNCATED)] + _TRUNCATED
    return text


def _is_run_id(value: object) -> bool:
    return isinstance(value, str) and _RUN_ID_RE.match(value) is not None


def _is_deadlock(error: exc.DBAPIError) -> bool:
    # MySQL/MariaDB ER_LOCK_DEADLOCK; PostgreSQL SQLSTATE 40P01.
    args: tuple[Any, ...] = getattr(error.orig, "args", ())
    return (bool(args) and args[0] == 1213) or getattr(error.orig, "sqlstate", None) == "40P01"


def _parse_cursor(cursor: object) -> tuple[int, str]:
    if isinstance(cursor, str):
        started, _, run_id = cursor.partition(":")
        if started.isdigit() and _is_run_id(run_id):
            return int(started), run_id
    raise ValueError(f"before must be a RunRecord.cursor ('<started_ms>:<run_id>'), got {cursor!r}")


class RunRecords:
    """The run records of one namespace in the library's database (table agent_async_run, migration 0003).

    Each operation opens and closes its own connection (NullPool), like the blob store and the schedule
    overrides: constructing one opens nothing, `close()` disposes the engine."""

    def __init__(
        self, database_url: str | URL, *, namespace: str, stale_after_s: float = DEFAULT_STALE_AFTER_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._url = parse_url(database_url)
        self.namespace = _name("namespace", namespace, tables.NAMESPACE_CHARS)
        if not (isinstance(stale_after_s, int | float) and math.isfinite(stale_after_s) and stale_after_s > 0):
            raise ValueError(f"stale_after_s must be a number of seconds > 0, got {stale_after_s!r}")
        self.stale_after_s = float(stale_after_s)
        self._clock = clock
        self._engine: AsyncEngine | None = None

    @classmethod
    def from_settings(cls, settings: AgentSettings, *, clock: Callable[[], float] = time.time) -> RunRecords:
        """On AGENT_DATABASE_URL, in AGENT_NAMESPACE, stale after AGENT_RUN_STALE_SECONDS."""
        return cls(settings.database_url, namespace=settings.namespace, stale_after_s=settings.run_stale_after_s,
                   clock=clock)

    def __repr__(self) -> str:
        return f"RunRecords({describe(self._url)}, namespace={self.namespace!r})"

    def _db(self) -> AsyncEngine:
        if self._engine is None:
            self._engine = create_engine(self._url)
            if self._url.get_backend_name() in ("mysql", "mariadb"):
                # InnoDB's default REPEATABLE READ gap-locks the range a conditional UPDATE scans:
                # two start()s (stale UPDATE, then INSERT into that range) deadlock each other.
                # READ COMMITTED (PostgreSQL's default) locks only the rows it changes.
                self._engine = self._engine.execution_options(isolation_level="READ COMMITTED")
        return self._engine

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    async def _write(self, work: Callable[[AsyncConnection], Awaitable[_T]]) -> _T:
        """`work` in one transaction. InnoDB may pick it as a deadlock's victim (a finish and the stale
        cleanup lock one row through different indexes): it was rolled back whole, so it runs again."""
        with translate_errors(self._url):
            for attempt in range(1, _DEADLOCK_ATTEMPTS + 1):
                try:
                    async with writing(self._db()).begin() as conn:
                        return await work(conn)
                except exc.DBAPIError as error:
                    if attempt == _DEADLOCK_ATTEMPTS or not _is_deadlock(error):
                        raise
                    logger.info("run records: deadlock on attempt %d, running the transaction again", attempt)
        raise AssertionError("unreachable")

    def _now_ms(self) -> int:
        # round, not int: 12.345 s may be 12344.999... ms in binary floating point.
        return round(self._clock() * 1000)

    def _this(self, run_id: str) -> ColumnElement[bool]:
        return (run_table.c.namespace == self.namespace) & (run_table.c.run_id == run_id)

    def _mark_stale(self, now_ms: int, kind: str | None) -> Update:
        # One conditional UPDATE: a heartbeat or a finish racing it either lands first (the row is
        # no longer stale) or finds the row ended (and reports it); a finished row never matches.
        t = run_table
        cutoff_ms = now_ms - round(self.stale_after_s * 1000)
        stale = (t.c.namespace == self.namespace) & (t.c.status == RunStatus.RUNNING.value)
        stale &= t.c.heartbeat_ms < cutoff_ms
        if kind is not None:
            stale &= t.c.kind == kind
        return update(t).where(stale).values(status=RunStatus.ERROR.value, error=STALE_ERROR, finished_ms=now_ms)

    async def mark_stale(self, kind: str | None = None) -> int:
        """End as ERROR "stale: worker lost" every running run (of `kind`, if given) whose heartbeat
        is older than `stale_after_s`; returns how many. Call it when a worker starts."""
        if kind is not None:
            _name("kind", kind, tables.KIND_CHARS)

        async def work(conn: AsyncConnection) -> int:
            return (await conn.execute(self._mark_stale(self._now_ms(), kind))).rowcount

        if marked := await self._write(work):
            logger.warning("%d run record(s) of %s ended as %r", marked, kind or "every kind", STALE_ERROR)
        return marked

    async def start(
        self, kind: str, *, triggered_by: RunTrigger, user_uid: str | None = None, job_id: str | None = None,
        group_id: str | None = None,
    ) -> RunRecord:
        """Record a new RUNNING run of `kind`, after marking the stale runs of that kind (same transaction)."""
        optional = (("user_uid", user_uid, tables.USER_UID_CHARS), ("job_id", job_id, tables.JOB_ID_CHARS),
                    ("group_id", group_id, tables.GROUP_ID_CHARS))
        for field, value, max_chars in optional:
            if value is not None:
                _name(field, value, max_chars)
        record = RunRecord(
            run_id=uuid.uuid4().hex, namespace=self.namespace, kind=_name("kind", kind, tables.KIND_CHARS),
            triggered_by=_enum(RunTrigger, "triggered_by", triggered_by), user_uid=user_uid,
            status=RunStatus.RUNNING, counters={}, error=None, failed_ids=(), job_id=job_id, group_id=group_id,
            started_ms=(now_ms := self._now_ms()), finished_ms=None, heartbeat_ms=now_ms,
        )

        async def work(conn: AsyncConnection) -> int:
            marked = (await conn.execute(self._mark_stale(now_ms, record.kind))).rowcount
            await conn.execute(insert(run_table).values(
                run_id=record.run_id, namespace=self.namespace, kind=record.kind,
                triggered_by=record.triggered_by.value, user_uid=user_uid, status=RunStatus.RUNNING.value,
                counters="{}", error=None, failed_ids="[]", job_id=job_id, group_id=group_id, started_ms=now_ms,
                finished_ms=None, heartbeat_ms=now_ms,
            ))
            return marked

        if marked := await self._write(work):
            logger.warning("%d run record(s) of %s ended as %r", marked, kind, STALE_ERROR)
        return record

    async def heartbeat(
        self, run_id: str, *, counters: dict[str, Any] | None = None, group_id: str | None = None,
    ) -> bool:
        """Keep a running run fresh (and replace its counters, or record the group it fanned out to,
        if given). False when the run has already ended (cancelled, or marked stale): the worker may
        stop. RunNotFoundError if unknown."""
        values: dict[str, Any] = {"heartbeat_ms": self._now_ms()}
        if counters is not None:
            values["counters"] = _counters(counters)
        if group_id is not None:
            values["group_id"] = _name("group_id", group_id, tables.GROUP_ID_CHARS)
        this = self._this(self._known(run_id))

        async def work(conn: AsyncConnection) -> bool:
            running = this & (run_table.c.status == RunStatus.RUNNING.value)
            if (await conn.execute(update(run_table).where(running).values(**values))).rowcount:
                return True
            if (await conn.execute(select(run_table.c.run_id).where(this))).first() is None:
                raise RunNotFoundError(f"no run record {run_id!r} in namespace {self.namespace!r}")
            return False

        return await self._write(work)

    async def finish(
        self, run_id: str, status: RunStatus, *, counters: dict[str, Any] | None = None, error: str | None = None,
        failed_ids: Sequence[str] | None = None,
    ) -> RunRecord:
        """End a running run with a terminal status; returns the record as stored.

        A run that has already ended (finished, cancelled, marked stale) is left as it is: the
        returned record then shows its first outcome, not this one. `counters` left None keep those
        of the last heartbeat ({} if none); `failed_ids` is a list or tuple, cut at MAX_FAILED_IDS.
        """
        final = _enum(RunStatus, "status", status)
        if final is RunStatus.RUNNING:
            raise ValueError(f"finish() needs a terminal status ({', '.join(sorted(TERMINAL_RUN_STATUSES))})")
        now_ms = self._now_ms()
        values: dict[str, Any] = {"status": final.value, "finished_ms": now_ms, "heartbeat_ms": now_ms,
                                  "error": None if error is None else _message("error", error)}
        if counters is not None:
            values["counters"] = _counters(counters)
        if failed_ids is not None:
            values["failed_ids"] = _failed_ids(run_id, failed_ids)
        return await self._end(run_id, final, values)

    async def cancel(self, run_id: str, *, reason: str) -> RunRecord:
        """End a running run as CANCELLED with `reason` as its message; an ended run is left as it is."""
        now_ms = self._now_ms()
        values = {"status": RunStatus.CANCELLED.value, "finished_ms": now_ms, "heartbeat_ms": now_ms,
                  "error": _message("reason", reason)}
        return await self._end(run_id, RunStatus.CANCELLED, values)

    async def cancel_for_job(self, job_id: str, *, reason: str) -> int:
        """End as CANCELLED the running runs recorded for a job (its cancel went through the
        canceller); returns how many. Ended runs are left as they are."""
        now_ms = self._now_ms()
        values = {"status": RunStatus.CANCELLED.value, "finished_ms": now_ms, "heartbeat_ms": now_ms,
                  "error": _message("reason", reason)}
        mine = (run_table.c.namespace == self.namespace) & (run_table.c.job_id == job_id)
        running = mine & (run_table.c.status == RunStatus.RUNNING.value)

        async def work(conn: AsyncConnection) -> int:
            return int((await conn.execute(update(run_table).where(running).values(**values))).rowcount)

        return await self._write(work)

    async def _end(self, run_id: str, status: RunStatus, values: dict[str, Any]) -> RunRecord:
        this = self._this(self._known(run_id))

        async def work(conn: AsyncConnection) -> tuple[int, RowMapping | None]:
            running = this & (run_table.c.status == RunStatus.RUNNING.value)
            updated = (await conn.execute(update(run_table).where(running).values(**values))).rowcount
            return updated, (await conn.execute(select(run_table).where(this))).mappings().first()

        updated, row = await self._write(work)
        if row is None:
            raise RunNotFoundError(f"no run record {run_id!r} in namespace {self.namespace!r}")
        record = RunRecord.from_row(row)
        if not updated:
            logger.info("run %s had already ended as %s; %s not recorded", run_id, record.status, status)
        return record

    def _known(self, run_id: str) -> str:
        # Ids are made by start(): anything else cannot be a record, and is not worth a query.
        if not _is_run_id(run_id):
            raise RunNotFoundError(f"no run record {run_id!r} in namespace {self.namespace!r}")
        return run_id

    async def get(self, run_id: str) -> RunRecord | None:
        if not _is_run_id(run_id):
            return None
        with translate_errors(self._url):
            async with self._db().connect() as conn:
                row = (await conn.execute(select(run_table).where(self._this(run_id)))).mappings().first()
        return None if row is None else RunRecord.from_row(row)

    async def list(
        self, *, kind: str | None = None, status: RunStatus | None = None, user_uid: str | None = None,
        limit: int = 50, before: str | None = None, before_ms: int | None = None,
    ) -> builtins.list[RunRecord]:
        """Runs newest first (started_ms, then run_id), filtered; keyset paging.

        Next page: `before=page[-1].cursor`. Pages neither repeat nor skip a row, even while new
        runs start. `before_ms` keeps only runs started before that time.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be an int from 1 to {MAX_LIST_LIMIT}, got {limit!r}")
        t = run_table
        where: ColumnElement[bool] = t.c.namespace == self.namespace
        if kind is not None:
            where &= t.c.kind == _name("kind", kind, tables.KIND_CHARS)
        if status is not None:
            where &= t.c.status == _enum(RunStatus, "status", status).value
        if user_uid is not None:
            where &= t.c.user_uid == _name("user_uid", user_uid, tables.USER_UID_CHARS)
        if before_ms is not None:
            if isinstance(before_ms, bool) or not isinstance(before_ms, int):
                raise TypeError(f"before_ms must be an int (epoch milliseconds), got {type(before_ms).__name__}")
            where &= t.c.started_ms < before_ms
        if before is not None:
            # Spelled out rather than a row-value comparison, which MySQL may not serve from an index.
            started_ms, run_id = _parse_cursor(before)
            where &= or_(t.c.started_ms < started_ms, and_(t.c.started_ms == started_ms, t.c.run_id < run_id))
        query = select(t).where(where).order_by(t.c.started_ms.desc(), t.c.run_id.desc()).limit(limit)
        with translate_errors(self._url):
            async with self._db().connect() as conn:
                rows = (await conn.execute(query)).mappings().all()
        return [RunRecord.from_row(row) for row in rows]
