"""Periodic jobs: one tracked run per tick, overrides at runtime, allowlist, skips, time zones."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from agent_async import Agent, AgentSettings, ClientAgent, JobStatus
from agent_async.schedules.overrides import ScheduleOverrides
from agent_async.storage import upgrade_async
from agent_async.storage.engine import create_engine, parse_url
from agent_async.testing import drain
from tests.conftest import run_burst, running_worker, wait_for_status
from tests.jobs import Nightly, Ticking

TICK = datetime(2026, 11, 30, 10, 15, tzinfo=UTC)


@pytest.fixture
async def overrides_url(tmp_path: Path) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path}/schedules.db"
    await upgrade_async(url)
    return url


@pytest.fixture
async def scheduled(settings: AgentSettings, overrides_url: str, agent: Agent) -> AsyncIterator[Agent]:
    """An agent whose scheduler keeps its overrides in a migrated SQLite file."""
    async with Agent(settings, overrides=ScheduleOverrides(overrides_url, namespace=settings.namespace)) as opened:
        yield opened


async def test_one_run_per_tick_across_workers(settings: AgentSettings, overrides_url: str, agent: Agent) -> None:
    """Three workers see the same tick: exactly one run, tagged with the schedule, then SUCCESS."""
    workers = [
        Agent(settings, overrides=ScheduleOverrides(overrides_url, namespace=settings.namespace)) for _ in range(3)
    ]
    for worker in workers:
        await worker.open()
    try:
        outcomes = await asyncio.gather(*(w.scheduler.fire(Ticking.name, TICK) for w in workers))
        assert sorted(outcomes) == ["duplicate", "duplicate", "enqueued"]
        # A second tick makes a second run (after the first one ended: the gate is 1). The worker's
        # own arq crons are off: a real minute boundary during the drain would add a run.
        await drain(workers[0], cron_jobs=[])
        outcomes = await asyncio.gather(
            *(w.scheduler.fire(Ticking.name, TICK + timedelta(minutes=1)) for w in workers[:2])
        )
        assert sorted(outcomes) == ["duplicate", "enqueued"]
        await drain(workers[0], cron_jobs=[])
    finally:
        for worker in workers:
            await worker.close()
    runs = await ClientAgent(agent).list_by_schedule(Ticking.name)
    assert [r.job_id for r in runs] == [
        f"{Ticking.name}@{int((TICK + timedelta(minutes=1)).timestamp() * 1000)}",
        f"{Ticking.name}@{int(TICK.timestamp() * 1000)}",
    ]
    assert all(r.status is JobStatus.SUCCESS and r.schedule_name == Ticking.name and r.user_uid is None for r in runs)


async def test_a_tick_while_the_previous_run_goes_on_is_skipped_and_recorded(scheduled: Agent) -> None:
    assert await scheduled.scheduler.fire(Ticking.name, TICK) == "enqueued"
    assert await scheduled.scheduler.fire(Ticking.name, TICK + timedelta(minutes=1)) == "skipped"
    skips = await scheduled.scheduler.skips(Ticking.name)
    assert skips == [
        {"fire_at": (TICK + timedelta(minutes=1)).isoformat(), "reason": "the previous run is still going"}
    ]


async def test_disable_enable_and_replace_take_effect_without_restart(scheduled: Agent) -> None:
    """Overrides are read at each tick (cached a few seconds at most), so no restart is needed."""
    scheduler = scheduled.scheduler
    await scheduler.overrides.set(Ticking.name, by="ops", enabled=False)
    assert await scheduler.fire(Ticking.name, TICK) == "disabled"
    assert (await scheduler.skips(Ticking.name))[0]["reason"] == "disabled by ops"
    await scheduler.overrides.set(Ticking.name, by="ops", enabled=True)
    assert await scheduler.fire(Ticking.name, TICK) == "enqueued"
    await run_burst(scheduled)

    await scheduler.overrides.set(Ticking.name, by="ops", cron="*/5 * * * *")
    # The declared cron's arq ticks now leave it to the override ticker, which follows */5.
    assert await scheduler.fire(Ticking.name, TICK + timedelta(minutes=1)) == "not-mine"
    assert (await scheduler.tick_overrides(TICK + timedelta(minutes=1)))[Ticking.name] == "not-due"
    assert (await scheduler.tick_overrides(TICK + timedelta(minutes=5)))[Ticking.name] == "enqueued"
    view = await scheduler.view(Ticking.name)
    assert view is not None and view.effective_cron == "*/5 * * * *" and view.enabled
    changes = await scheduler.overrides.changes(Ticking.name)
    assert [c.change for c in changes] == [{"cron": "*/5 * * * *"}, {"enabled": True}, {"enabled": False}]
    assert {c.changed_by for c in changes} == {"ops"}


async def test_override_broken_by_hand_disables_only_that_schedule(scheduled: Agent, overrides_url: str) -> None:
    await scheduled.scheduler.overrides.set(Ticking.name, by="ops", enabled=True)
    engine = create_engine(parse_url(overrides_url))
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE agent_async_schedule_override SET cron = 'every day at noon'"))
    await engine.dispose()
    await scheduled.scheduler.overrides.all(fresh=True)
    assert await scheduled.scheduler.fire(Ticking.name, TICK) == "disabled"
    view = await scheduled.scheduler.view(Ticking.name)
    assert view is not None and not view.enabled and view.next_run is None
    assert view.disabled_reason is not None and view.disabled_reason.startswith("invalid cron override")
    friday_13 = datetime(2026, 11, 13, 3, 0, tzinfo=UTC)
    assert await scheduled.scheduler.fire(Nightly.name, friday_13) == "enqueued", "other schedules still run"


async def test_allowlist_runs_only_listed_schedules(settings: AgentSettings, overrides_url: str, agent: Agent) -> None:
    listed = dataclasses.replace(settings, schedule_allowlist=(Nightly.name,))
    async with Agent(listed, overrides=ScheduleOverrides(overrides_url, namespace=settings.namespace)) as allow:
        await allow.scheduler.overrides.set(Ticking.name, by="ops", enabled=True)
        assert await allow.scheduler.fire(Ticking.name, TICK) == "disabled"
        views = {v.name: v for v in await allow.scheduler.views()}
        assert views[Ticking.name].disabled_reason == "not in AGENT_SCHEDULE_ALLOWLIST"
        assert views[Ticking.name].override is not None, "its stored row is kept"
        assert views[Nightly.name].enabled


async def test_schedules_still_run_when_the_override_store_is_down(settings: AgentSettings, agent: Agent) -> None:
    down = ScheduleOverrides("postgresql+asyncpg://nobody:secret@127.0.0.1:1/none", namespace=settings.namespace)
    async with Agent(settings, overrides=down) as orphaned:
        assert await orphaned.scheduler.fire(Ticking.name, TICK) == "enqueued"


async def test_time_zone_reads_crons_in_local_time(settings: AgentSettings, overrides_url: str, agent: Agent) -> None:
    """In Europe/Paris, "0 3 13 * fri" next fires at 03:00 Paris time (02:00 UTC in winter)."""
    paris = dataclasses.replace(settings, schedule_timezone="Europe/Paris")
    async with Agent(paris, overrides=ScheduleOverrides(overrides_url, namespace=settings.namespace)) as local:
        view = await local.scheduler.view(Nightly.name)
        assert view is not None and view.next_run is not None
        assert (view.next_run.hour, view.next_run.minute) == (3, 0)
        assert view.next_run.utcoffset() in (timedelta(hours=1), timedelta(hours=2))
        assert local.worker_settings()["timezone"].key == "Europe/Paris"


def test_each_cron_becomes_arq_cron_functions(agent: Agent) -> None:
    """A day-of-month + day-of-week cron becomes two arq crons; a per-minute override ticker too."""
    crons = {c.name: c for c in agent.worker_settings()["cron_jobs"]}
    ns = agent.keys.namespace
    assert {
        f"{ns}:cron:{Nightly.name}:0",
        f"{ns}:cron:{Nightly.name}:1",
        f"{ns}:cron:{Ticking.name}:0",
        f"{ns}:cron:_overrides",
    } <= set(crons)
    first, second = crons[f"{ns}:cron:{Nightly.name}:0"], crons[f"{ns}:cron:{Nightly.name}:1"]
    assert (first.day, first.weekday, first.hour, first.minute) == ({13}, None, {3}, {0})
    assert (second.day, second.weekday) == (None, {4}), "Friday is 4 in arq's numbering"


@pytest.mark.slow
async def test_a_real_tick_of_two_running_workers(
    scheduled: Agent, settings: AgentSettings, overrides_url: str
) -> None:
    """Real time: two workers running across a minute boundary create that minute's run once."""
    async with (
        Agent(settings, overrides=ScheduleOverrides(overrides_url, namespace=settings.namespace)) as second,
        running_worker(scheduled),
        running_worker(second),
    ):
        deadline = asyncio.get_running_loop().time() + 75
        runs = []
        while not runs and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.5)
            runs = await scheduled.job_store.list_by_schedule(Ticking.name)
        assert runs, "no tick within 75 s"
        state = await wait_for_status(scheduled, runs[0].job_id, JobStatus.SUCCESS)
        await asyncio.sleep(1)  # the slower worker's tick, if any, has landed by now
        fire_ms = int(state.job_id.rsplit("@", 1)[1])
        same_minute = [
            r for r in await scheduled.job_store.list_by_schedule(Ticking.name) if r.job_id == state.job_id
        ]
    assert fire_ms % 60_000 == 0, "fired on a minute boundary"
    assert len(same_minute) == 1
    assert len(await scheduled.job_store.list_by_schedule(Ticking.name)) == 1
