"""Run records (agent_async.runs) on SQLite, PostgreSQL and MariaDB: lifecycle, paging, stale cleanup, migration."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, exc, inspect, text
from sqlalchemy.engine import URL, make_url

from agent_async import AgentSettings, ConfigurationError, RunRecord, RunRecords, RunStatus, RunTrigger
from agent_async.errors import StorageError, StorageUnavailableError
from agent_async.runs import (
    MAX_ERROR_CHARS,
    MAX_FAILED_IDS,
    MAX_LIST_LIMIT,
    STALE_ERROR,
    TERMINAL_RUN_STATUSES,
    RunNotFoundError,
)
from agent_async.runs.tables import RUN_TABLE
from agent_async.storage import upgrade_async
from agent_async.storage.engine import create_engine
from agent_async.storage.migrate import alembic_config
from agent_async.storage.schema import VERSION_TABLE, metadata
from agent_async.storage.testing import scratch_database
from tests.databases import BACKENDS, scratch_server_database, server_url, unreachable

INDEXES = {
    "ix_agent_async_run_kind_started": ["namespace", "kind", "started_ms", "run_id"],
    "ix_agent_async_run_started": ["namespace", "started_ms", "run_id"],
    "ix_agent_async_run_user_started": ["namespace", "user_uid", "started_ms", "run_id"],
    "ix_agent_async_run_status": ["namespace", "status", "started_ms", "run_id"],
}
T0 = 1_800_000_000.0  # seconds; 2027-01-15
STALE_S = 60.0
SYNC = "calendar.sync.external.auto"


class Clock:
    """The injectable clock: time moves only when a test says so."""

    def __init__(self, now_s: float = T0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


# -- databases: one throw-away migrated database per backend per session, as tests/storage does ----


@pytest.fixture(scope="session")
def runs_sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> URL:
    url = make_url(f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('runs') / 'runs.db'}")
    asyncio.run(upgrade_async(url))
    return url


@pytest.fixture(scope="session")
def runs_postgresql_url() -> Iterator[URL]:
    yield from scratch_server_database("postgresql")


@pytest.fixture(scope="session")
def runs_mariadb_url() -> Iterator[URL]:
    yield from scratch_server_database("mariadb")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest) -> URL:
    url: URL = request.getfixturevalue(f"runs_{backend}_url")
    return url


@pytest.fixture
def clock() -> Clock:
    return Clock()


MakeRuns = Callable[..., RunRecords]


@pytest.fixture
async def make_runs(database_url: URL, clock: Clock) -> AsyncIterator[MakeRuns]:
    """RunRecords on the backend under test, each in a namespace of its own unless told; closed afterwards."""
    made: list[RunRecords] = []

    def make(namespace: str | None = None, **kwargs: Any) -> RunRecords:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("stale_after_s", STALE_S)
        runs = RunRecords(database_url, namespace=namespace or f"t-{uuid.uuid4().hex[:16]}", **kwargs)
        made.append(runs)
        return runs

    yield make
    for runs in made:
        await runs.close()


@pytest.fixture
def runs(make_runs: MakeRuns) -> RunRecords:
    return make_runs()


async def start(runs: RunRecords, kind: str = SYNC, **kwargs: Any) -> RunRecord:
    kwargs.setdefault("triggered_by", RunTrigger.SCHEDULED)
    return await runs.start(kind, **kwargs)


# -- lifecycle -------------------------------------------------------------------------------------


async def test_start_heartbeat_finish_round_trip_keeps_counters_and_failed_ids(
    runs: RunRecords, clock: Clock
) -> None:
    started = await runs.start(SYNC, triggered_by=RunTrigger.MANUAL, user_uid="alice", job_id="j-1", group_id="g-1")
    assert started.status is RunStatus.RUNNING and len(started.run_id) == 32
    assert (started.started_ms, started.heartbeat_ms, started.finished_ms) == (round(T0 * 1000), round(T0 * 1000), None)
    assert await runs.get(started.run_id) == started

    clock.advance(5)
    assert await runs.heartbeat(started.run_id, counters={"synced": 3, "failed": 1}) is True
    beating = await runs.get(started.run_id)
    assert beating is not None and beating.counters == {"synced": 3, "failed": 1}
    assert beating.heartbeat_ms == round((T0 + 5) * 1000) and beating.status is RunStatus.RUNNING

    clock.advance(5)
    done = await runs.finish(started.run_id, RunStatus.PARTIAL, error="1 event refused", failed_ids=["evt-9"])
    assert done == await runs.get(started.run_id)
    assert (done.status, done.counters, done.error, done.failed_ids) == (
        RunStatus.PARTIAL, {"synced": 3, "failed": 1}, "1 event refused", ("evt-9",)
    )
    assert (done.triggered_by, done.user_uid, done.job_id, done.group_id, done.kind) == (
        RunTrigger.MANUAL, "alice", "j-1", "g-1", SYNC
    )
    assert done.finished_ms == round((T0 + 10) * 1000)


async def test_to_dict_gives_iso_8601_times_and_json_values(runs: RunRecords) -> None:
    run = await start(runs, user_uid="zoë")
    done = await runs.finish(run.run_id, RunStatus.SUCCESS, counters={"synced": 2, "note": "日本 🗓️"})
    view = done.to_dict()
    assert view == {
        "run_id": run.run_id, "kind": SYNC, "triggered_by": "scheduled", "user_uid": "zoë", "status": "success",
        "counters": {"synced": 2, "note": "日本 🗓️"}, "error": None, "failed_ids": [], "job_id": None,
        "group_id": None, "started_at": "2027-01-15T08:00:00.000+00:00",
        "finished_at": "2027-01-15T08:00:00.000+00:00", "heartbeat_at": "2027-01-15T08:00:00.000+00:00",
    }


async def test_heartbeat_at_the_same_millisecond_still_reports_running(runs: RunRecords) -> None:
    """An UPDATE that changes nothing still counts as found (MySQL reports changed rows unless told otherwise)."""
    run = await start(runs)
    assert await runs.heartbeat(run.run_id) is True
    assert await runs.heartbeat(run.run_id) is True


async def test_finish_twice_keeps_the_first_outcome(runs: RunRecords, clock: Clock) -> None:
    """The second finish is a no-op: it returns the stored record unchanged and never overwrites it."""
    run = await start(runs)
    first = await runs.finish(run.run_id, RunStatus.SUCCESS, counters={"synced": 3})
    clock.advance(1)
    second = await runs.finish(run.run_id, RunStatus.ERROR, counters={"synced": 0}, error="late", failed_ids=["x"])
    assert second == first == await runs.get(run.run_id)
    assert await runs.heartbeat(run.run_id, counters={"synced": 99}) is False
    assert await runs.get(run.run_id) == first


async def test_finish_with_running_is_refused(runs: RunRecords) -> None:
    run = await start(runs)
    with pytest.raises(ValueError, match="terminal status"):
        await runs.finish(run.run_id, RunStatus.RUNNING)
    with pytest.raises(ValueError, match="RunStatus"):
        await runs.finish(run.run_id, "done")  # type: ignore[arg-type]
    assert (await runs.get(run.run_id)) == run
    assert set(RunStatus) - {RunStatus.RUNNING} == TERMINAL_RUN_STATUSES


async def test_cancel_ends_only_a_running_run(runs: RunRecords, clock: Clock) -> None:
    run = await start(runs)
    clock.advance(2)
    cancelled = await runs.cancel(run.run_id, reason="cancelled by ops")
    assert (cancelled.status, cancelled.error, cancelled.finished_ms) == (
        RunStatus.CANCELLED, "cancelled by ops", round((T0 + 2) * 1000)
    )
    assert await runs.heartbeat(run.run_id) is False, "the worker learns it was cancelled"
    assert await runs.finish(run.run_id, RunStatus.SUCCESS) == cancelled, "the worker's late finish is ignored"

    finished = await runs.finish((await start(runs)).run_id, RunStatus.SUCCESS)
    assert await runs.cancel(finished.run_id, reason="too late") == finished


async def test_unknown_run_ids(runs: RunRecords, make_runs: MakeRuns) -> None:
    """get() answers None; heartbeat, finish and cancel raise RunNotFoundError (also for another namespace's run)."""
    other = await start(make_runs())
    for run_id in (uuid.uuid4().hex, other.run_id, "not-an-id", ""):
        assert await runs.get(run_id) is None
        with pytest.raises(RunNotFoundError):
            await runs.heartbeat(run_id)
        with pytest.raises(RunNotFoundError):
            await runs.finish(run_id, RunStatus.SUCCESS)
        with pytest.raises(RunNotFoundError):
            await runs.cancel(run_id, reason="x")


# -- list and paging -------------------------------------------------------------------------------


async def test_list_filters_by_kind_status_and_user_newest_first(runs: RunRecords, clock: Clock) -> None:
    a = await start(runs, "a", user_uid="alice")
    clock.advance(1)
    b = await start(runs, "b", user_uid="bob", triggered_by=RunTrigger.MANUAL)
    clock.advance(1)
    c = await start(runs, "a")
    await runs.finish(a.run_id, RunStatus.SUCCESS)
    await runs.finish(b.run_id, RunStatus.ERROR, error="x")

    def ids(records: list[RunRecord]) -> list[str]:
        return [r.run_id for r in records]

    assert ids(await runs.list()) == [c.run_id, b.run_id, a.run_id]
    assert ids(await runs.list(kind="a")) == [c.run_id, a.run_id]
    assert ids(await runs.list(status=RunStatus.RUNNING)) == [c.run_id]
    assert ids(await runs.list(status=RunStatus.ERROR)) == [b.run_id]
    assert ids(await runs.list(user_uid="alice")) == [a.run_id]
    assert ids(await runs.list(kind="a", status=RunStatus.SUCCESS, user_uid="alice")) == [a.run_id]
    assert ids(await runs.list(kind="a", user_uid="bob")) == []
    assert ids(await runs.list(before_ms=c.started_ms)) == [b.run_id, a.run_id]
    assert ids(await runs.list(limit=1)) == [c.run_id]


async def test_pages_follow_each_other_without_duplicates_or_gaps(runs: RunRecords, clock: Clock) -> None:
    """Keyset paging on (started_ms, run_id): runs started in the same millisecond and runs started
    while paging never make a page repeat or skip a row."""
    for index in range(11):
        await start(runs)
        if index % 3 == 2:  # three runs per millisecond: the run_id breaks the ties
            clock.advance(0.001)
    everything = await runs.list(limit=MAX_LIST_LIMIT)
    assert len(everything) == 11
    assert [(r.started_ms, r.run_id) for r in everything] == sorted(
        ((r.started_ms, r.run_id) for r in everything), reverse=True
    )
    pages: list[list[RunRecord]] = [await runs.list(limit=4)]
    await start(runs)  # newer than every page: must not shift the next ones
    while len(pages[-1]) == 4:
        pages.append(await runs.list(limit=4, before=pages[-1][-1].cursor))
    assert [len(page) for page in pages] == [4, 4, 3]
    assert [r.run_id for page in pages for r in page] == [r.run_id for r in everything]


async def test_list_refuses_bad_paging_arguments(runs: RunRecords) -> None:
    for limit in (0, MAX_LIST_LIMIT + 1, True, "10"):
        with pytest.raises(ValueError, match="limit"):
            await runs.list(limit=limit)  # type: ignore[arg-type]
    for cursor in ("", "12", "x:" + "0" * 32, "12:NOT-HEX", "12:" + "0" * 31):
        with pytest.raises(ValueError, match="cursor"):
            await runs.list(before=cursor)
    with pytest.raises(TypeError, match="before_ms"):
        await runs.list(before_ms=1.5)  # type: ignore[arg-type]


# -- stale cleanup ---------------------------------------------------------------------------------


async def test_mark_stale_ends_only_running_rows_older_than_the_threshold(runs: RunRecords, clock: Clock) -> None:
    lost = await start(runs, "k1")
    other_kind = await start(runs, "k2")
    ended = await runs.finish((await start(runs, "k1")).run_id, RunStatus.SUCCESS)
    clock.advance(STALE_S / 2)
    fresh = await start(runs, "k1")
    clock.advance(STALE_S / 2 + 0.001)  # `lost` is now STALE_S + 1 ms old, `ended` as old but finished

    assert await runs.mark_stale("k1") == 1
    marked = await runs.get(lost.run_id)
    assert marked is not None
    assert (marked.status, marked.error, marked.finished_ms) == (RunStatus.ERROR, STALE_ERROR, round(clock() * 1000))
    assert marked.heartbeat_ms == lost.heartbeat_ms, "the last sign of life is kept"
    assert await runs.get(ended.run_id) == ended, "a finished row is never touched"
    assert (await runs.get(fresh.run_id)) == fresh
    assert (await runs.get(other_kind.run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]

    assert await runs.mark_stale() == 1, "no kind: every kind"
    assert (await runs.get(other_kind.run_id)).error == STALE_ERROR  # type: ignore[union-attr]
    assert await runs.mark_stale() == 0
    assert await runs.heartbeat(lost.run_id) is False, "a worker that was only slow learns its run was ended"
    assert await runs.finish(lost.run_id, RunStatus.SUCCESS) == marked


async def test_a_heartbeat_exactly_at_the_threshold_is_not_stale(runs: RunRecords, clock: Clock) -> None:
    run = await start(runs)
    clock.advance(STALE_S)
    assert await runs.mark_stale() == 0
    clock.advance(0.001)
    assert await runs.mark_stale() == 1
    assert (await runs.get(run.run_id)).status is RunStatus.ERROR  # type: ignore[union-attr]


async def test_heartbeats_keep_a_long_run_from_going_stale(runs: RunRecords, clock: Clock) -> None:
    run = await start(runs)
    for _ in range(5):
        clock.advance(STALE_S * 0.9)
        assert await runs.heartbeat(run.run_id) is True
        assert await runs.mark_stale() == 0


async def test_start_cleans_up_stale_rows_of_its_own_kind_only(runs: RunRecords, clock: Clock) -> None:
    lost = await start(runs, SYNC)
    lost_other = await start(runs, "calendar.export")
    clock.advance(STALE_S + 1)
    new = await start(runs, SYNC)
    assert (await runs.get(lost.run_id)).error == STALE_ERROR  # type: ignore[union-attr]
    assert (await runs.get(lost_other.run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
    assert (await runs.get(new.run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]


# -- namespaces ------------------------------------------------------------------------------------


async def test_namespaces_sharing_a_database_never_see_each_others_rows(make_runs: MakeRuns, clock: Clock) -> None:
    """Also when they differ only by case: MariaDB's default collations would confuse `Prod` and `prod`."""
    suffix = uuid.uuid4().hex[:12]
    prod, other, shouting = make_runs(f"prod-{suffix}"), make_runs(f"test-{suffix}"), make_runs(f"PROD-{suffix}")
    mine = await start(prod, user_uid="alice")
    theirs = await start(other, user_uid="alice")
    loud = await start(shouting, user_uid="ALICE")
    clock.advance(STALE_S + 1)
    assert [r.run_id for r in await prod.list()] == [mine.run_id]
    assert [r.run_id for r in await prod.list(user_uid="alice")] == [mine.run_id]
    assert await prod.list(user_uid="ALICE") == [], "user ids compare exactly too"
    assert await prod.get(theirs.run_id) is None and await prod.get(loud.run_id) is None
    with pytest.raises(RunNotFoundError):
        await prod.finish(theirs.run_id, RunStatus.SUCCESS)
    assert await prod.mark_stale() == 1
    assert (await other.get(theirs.run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
    assert (await shouting.get(loud.run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
    await start(other)  # its own stale cleanup leaves the other namespaces alone
    assert (await shouting.get(loud.run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]


# -- input at the boundary -------------------------------------------------------------------------

BAD_STARTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"kind": ""}, ValueError, "kind"),
    ({"kind": "k" * 256}, ValueError, "kind"),
    ({"kind": "a\x00b"}, ValueError, "kind"),
    ({"kind": 7}, TypeError, "kind"),
    ({"triggered_by": "cron"}, ValueError, "triggered_by"),
    ({"triggered_by": None}, ValueError, "triggered_by"),
    ({"user_uid": ""}, ValueError, "user_uid"),
    ({"user_uid": "u" * 256}, ValueError, "user_uid"),
    ({"user_uid": "bad\udc80"}, ValueError, "user_uid"),
    ({"job_id": 12}, TypeError, "job_id"),
    ({"group_id": "g\n"}, ValueError, "group_id"),
]


async def test_bad_input_is_refused_with_a_clear_error_and_writes_nothing(runs: RunRecords) -> None:
    for override, error, field in BAD_STARTS:
        arguments: dict[str, Any] = {"kind": SYNC, "triggered_by": RunTrigger.MANUAL, **override}
        with pytest.raises(error, match=field):
            await runs.start(arguments.pop("kind"), **arguments)
    assert await runs.list() == []

    run = await start(runs)
    bad_finishes: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"counters": [1, 2]}, TypeError, "counters"),
        ({"counters": {"rate": float("nan")}}, ValueError, "counters"),
        ({"counters": {1: 2}}, ValueError, "counters"),
        ({"counters": {"when": object()}}, ValueError, "counters.when"),
        ({"counters": {"blob": "x" * 20_000}}, ValueError, "counters"),
        ({"failed_ids": "abc"}, TypeError, "failed_ids"),
        ({"failed_ids": ["ok", 3]}, TypeError, r"failed_ids\[1\]"),
        ({"failed_ids": ["x" * 256]}, ValueError, r"failed_ids\[0\]"),
        ({"error": RuntimeError("boom")}, TypeError, "error"),
    ]
    for arguments, error, field in bad_finishes:
        with pytest.raises(error, match=field):
            await runs.finish(run.run_id, RunStatus.ERROR, **arguments)
    with pytest.raises(TypeError, match="counters"):
        await runs.heartbeat(run.run_id, counters=["x"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reason"):
        await runs.cancel(run.run_id, reason=None)  # type: ignore[arg-type]
    assert await runs.get(run.run_id) == run, "a refused call changes nothing"


async def test_error_messages_are_cut_and_made_storable(runs: RunRecords) -> None:
    """NUL (refused by PostgreSQL) and lone surrogates (refused by every driver) are replaced; long text is cut."""
    run = await start(runs)
    done = await runs.finish(run.run_id, RunStatus.ERROR, error="a\x00b\udc80c " + "é" * (2 * MAX_ERROR_CHARS))
    assert done.error is not None and len(done.error) == MAX_ERROR_CHARS
    assert done.error.startswith("a\ufffdb?c é") and done.error.endswith(" [truncated]")
    assert (await runs.get(run.run_id)) == done


async def test_failed_ids_are_capped_and_odd_text_survives(runs: RunRecords) -> None:
    run = await start(runs, "sync.ünïcode 🗓️", user_uid="zoë")
    ids = [f"evt-{n}" for n in range(MAX_FAILED_IDS + 50)] + ["nul\x00", "surrogate\udc80"]
    done = await runs.finish(run.run_id, RunStatus.PARTIAL, failed_ids=ids, counters={"failed": len(ids), "k": "\x00"})
    assert done.failed_ids == tuple(ids[:MAX_FAILED_IDS])
    assert done.counters == {"failed": MAX_FAILED_IDS + 52, "k": "\x00"}
    assert [r.run_id for r in await runs.list(kind="sync.ünïcode 🗓️", user_uid="zoë")] == [run.run_id]
    odd = await runs.finish((await start(runs)).run_id, RunStatus.PARTIAL, failed_ids=("nul\x00", "s\udc80"))
    assert (await runs.get(odd.run_id)).failed_ids == ("nul\x00", "s\udc80")  # type: ignore[union-attr]


def test_construction_checks_its_arguments_and_opens_nothing() -> None:
    runs = RunRecords("postgresql+asyncpg://u:pw@127.0.0.1:1/x", namespace="agent")
    assert "pw" not in repr(runs) and runs.stale_after_s == 2700.0
    for stale_after_s in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="stale_after_s"):
            RunRecords("sqlite+aiosqlite:///x.db", namespace="agent", stale_after_s=stale_after_s)
    for namespace in ("", "n" * 65):
        with pytest.raises(ValueError, match="namespace"):
            RunRecords("sqlite+aiosqlite:///x.db", namespace=namespace)
    with pytest.raises(StorageError):
        RunRecords("not a url", namespace="agent")


def test_from_settings_uses_the_database_namespace_and_stale_setting() -> None:
    settings = AgentSettings.from_env({"AGENT_RUN_STALE_SECONDS": "90", "AGENT_NAMESPACE": "prod"})
    runs = RunRecords.from_settings(settings)
    assert (runs.namespace, runs.stale_after_s) == ("prod", 90.0)
    assert AgentSettings().run_stale_after_s == 2700.0
    for bad in ("0", "-5", "soon"):
        with pytest.raises(ConfigurationError, match="AGENT_RUN_STALE_SECONDS"):
            AgentSettings.from_env({"AGENT_RUN_STALE_SECONDS": bad})


# -- failures --------------------------------------------------------------------------------------

PASSWORD = "s3cr3t-Pa55"
DOWN_URLS = {
    "PostgreSQL": f"postgresql+asyncpg://agent:{PASSWORD}@127.0.0.1:1/runs",
    "MariaDB": f"mysql+aiomysql://agent:{PASSWORD}@127.0.0.1:1/runs",
}
RUN_ID = "0" * 32
OPERATIONS: dict[str, Callable[[RunRecords], Awaitable[object]]] = {
    "start": lambda runs: runs.start(SYNC, triggered_by=RunTrigger.MANUAL),
    "heartbeat": lambda runs: runs.heartbeat(RUN_ID),
    "finish": lambda runs: runs.finish(RUN_ID, RunStatus.SUCCESS),
    "cancel": lambda runs: runs.cancel(RUN_ID, reason="x"),
    "get": lambda runs: runs.get(RUN_ID),
    "list": lambda runs: runs.list(),
    "mark_stale": lambda runs: runs.mark_stale(),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("down", sorted(DOWN_URLS))
async def test_database_down_raises_unavailable_without_the_password(down: str, operation: str) -> None:
    runs = RunRecords(DOWN_URLS[down], namespace="agent")
    with pytest.raises(StorageUnavailableError) as caught:
        await OPERATIONS[operation](runs)
    assert isinstance(caught.value, ConnectionError)
    message = str(caught.value)
    assert down in message and "127.0.0.1:1" in message
    assert PASSWORD not in message and PASSWORD not in repr(runs)
    assert "SELECT" not in message and "UPDATE" not in message and "INSERT" not in message
    await runs.close()


async def test_unmigrated_database_names_the_migration_command(tmp_path: Path) -> None:
    runs = RunRecords(f"sqlite+aiosqlite:///{tmp_path}/empty.db", namespace="agent")
    with pytest.raises(StorageError, match=r"agent_async\.storage\.migrate") as caught:
        await runs.start(SYNC, triggered_by=RunTrigger.MANUAL)
    assert not isinstance(caught.value, StorageUnavailableError)
    await runs.close()


class _DriverError(Exception):
    """What pymysql raises: (errno, message)."""


async def test_a_deadlock_victim_is_run_again_and_other_errors_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """InnoDB rolls a deadlock's victim back whole (seen under load: a finish against the stale
    cleanup), so the transaction is run again, up to 3 times; any other error is raised at once."""
    url = f"sqlite+aiosqlite:///{tmp_path}/deadlock.db"
    await upgrade_async(url)
    runs = RunRecords(url, namespace="agent")
    engine = runs._db()
    deadlock = (1213, "Deadlock found when trying to get lock; try restarting transaction")
    failures: list[tuple[int, str]] = []

    class Flaky:
        """The engine, except that the next begin()s fail with `failures`, as the driver would."""

        calls = 0
        dialect = engine.dialect

        def execution_options(self, **options: Any) -> Any:
            return self  # the write option of agent_async.storage.engine.writing: nothing to fake

        def begin(self) -> Any:
            Flaky.calls += 1
            if failures:
                raise exc.OperationalError("UPDATE agent_async_run ...", {}, _DriverError(*failures.pop()))
            return engine.begin()

        def connect(self) -> Any:
            return engine.connect()

    monkeypatch.setattr(runs, "_db", Flaky)
    failures[:] = [deadlock] * 2
    run = await runs.start(SYNC, triggered_by=RunTrigger.MANUAL)
    assert Flaky.calls == 3 and await runs.get(run.run_id) == run
    failures[:] = [deadlock] * 3
    with pytest.raises(StorageUnavailableError, match="Deadlock"):
        await runs.finish(run.run_id, RunStatus.SUCCESS)
    Flaky.calls, failures[:] = 0, [(1205, "Lock wait timeout exceeded")]
    with pytest.raises(StorageUnavailableError, match="Lock wait timeout"):
        await runs.finish(run.run_id, RunStatus.SUCCESS)
    assert Flaky.calls == 1
    assert (await runs.get(run.run_id)).status is RunStatus.RUNNING  # type: ignore[union-attr]
    await engine.dispose()


# -- migration -------------------------------------------------------------------------------------


@asynccontextmanager
async def fresh_database(backend: str, tmp_path: Path) -> AsyncIterator[URL]:
    """An empty database (no tables at all) on the backend, dropped afterwards."""
    if backend == "sqlite":
        yield make_url(f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
        return
    url_of_server = server_url(backend)
    manager = scratch_database(url_of_server, migrate=False)
    try:
        url = await manager.__aenter__()
    except Exception as error:
        unreachable(backend, url_of_server, error)
    try:
        yield url
    finally:
        await manager.__aexit__(None, None, None)


def _layout(conn: Connection) -> dict[str, Any]:
    inspector = inspect(conn)
    tables = set(inspector.get_table_names())
    indexes = {}
    if RUN_TABLE in tables:
        indexes = {ix["name"]: ix["column_names"] for ix in inspector.get_indexes(RUN_TABLE)}
    version = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one()
    return {"has_table": RUN_TABLE in tables, "indexes": indexes, "version": version}


def _diff(conn: Connection) -> list[Any]:
    def only_runs(item: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        table = item if type_ == "table" else getattr(item, "table", None)
        return getattr(table, "name", None) == RUN_TABLE

    context = MigrationContext.configure(conn, opts={"include_object": only_runs})
    return list(compare_metadata(context, metadata))


def _mariadb_charsets(conn: Connection) -> dict[str, tuple[str, str]]:
    rows = conn.execute(text(
        "SELECT column_name, character_set_name, collation_name FROM information_schema.columns"
        " WHERE table_schema = DATABASE() AND table_name = :table AND character_set_name IS NOT NULL"
    ), {"table": RUN_TABLE})
    return {name: (charset, collation) for name, charset, collation in rows}


def _downgrade(conn: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = conn
    command.downgrade(config, revision)


async def test_migration_creates_the_table_and_indexes_and_downgrade_drops_them(
    backend: str, tmp_path: Path
) -> None:
    async with fresh_database(backend, tmp_path) as url:
        await upgrade_async(url)
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                layout = await conn.run_sync(_layout)
                assert layout == {"has_table": True, "indexes": INDEXES, "version": "0003"}
                assert await conn.run_sync(_diff) == [], "tables.py and migration 0003 agree"
                if backend == "mariadb":  # Alembic does not compare charsets and collations
                    charsets = await conn.run_sync(_mariadb_charsets)
                    exact = {"namespace", "kind", "user_uid", "job_id", "group_id"}
                    assert {c: charsets[c] for c in exact} == dict.fromkeys(exact, ("utf8mb4", "utf8mb4_bin"))
                    assert charsets["error"][0] == "utf8mb4"
            async with engine.connect() as conn:
                await conn.run_sync(_downgrade, "0002")
                await conn.commit()
            async with engine.connect() as conn:
                assert await conn.run_sync(_layout) == {"has_table": False, "indexes": {}, "version": "0002"}
        finally:
            await engine.dispose()
        await upgrade_async(url)  # and up again
        runs = RunRecords(url, namespace="agent")
        try:
            run = await runs.start(SYNC, triggered_by=RunTrigger.SCHEDULED)
            assert await runs.get(run.run_id) == run
        finally:
            await runs.close()


async def test_a_finish_racing_the_stale_cleanup_never_overwrites_it(make_runs: MakeRuns, clock: Clock) -> None:
    """Two processes (two instances, two connections): exactly one outcome is stored, and both know which."""
    namespace = f"t-{uuid.uuid4().hex[:16]}"
    worker, cleaner = make_runs(namespace), make_runs(namespace)
    for _ in range(10):
        run = await start(worker)
        clock.advance(STALE_S + 1)
        finished, marked = await asyncio.gather(worker.finish(run.run_id, RunStatus.SUCCESS), cleaner.mark_stale())
        stored = await worker.get(run.run_id)
        assert stored == finished
        assert stored.status is (RunStatus.ERROR if marked else RunStatus.SUCCESS), (marked, stored)
