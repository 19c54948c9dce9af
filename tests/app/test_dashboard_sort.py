"""The dashboard's jobs list sorted both ways and cut to a creation window (issue 15), through the app's test
client on real Redis: the order, the window's bounds (with the other filters), paging with both, the form
keeping its values, bad values as 422, and a viewer using all of it."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest
from quart.typing import TestClientProtocol as DashClient
from redis.asyncio import Redis

from agent_async import JobStatus
from agent_async.registry import JobRegistry
from agent_async.store.listing import JobOrder
from app.dashboard.session import DashboardRole
from app.factory import create_app
from app.runtime import EXTENSION_KEY
from tests.app.conftest import make_settings
from tests.app.test_dashboard import OTHER_JOB, SECRET_JOB, Dash, declare_jobs

pytestmark = pytest.mark.timeout(60)

HOUR_MS = 3_600_000
# The jobs' creation times are set to whole hours from here: 2026-01-01T00:00 UTC.
BASE_MS = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)


@pytest.fixture
async def dash(sqlite_url: str, namespace: str, redis: Redis, job_registry: JobRegistry) -> AsyncIterator[Dash]:
    declare_jobs()
    app = create_app(make_settings(sqlite_url, namespace))
    async with app.test_app():
        yield Dash(app=app, runtime=app.extensions[EXTENSION_KEY])


async def created_at(dash: Dash, job_id: str, hour: int) -> None:
    """Move a job's creation time to BASE + `hour` hours: its state and its score in every index scored by
    creation (all jobs, its user's, its job type's), as enqueue.lua would have written them."""
    state = await dash.runtime.client.get_state(job_id)
    assert state is not None and state.user_uid is not None
    store = dash.runtime.client.listing._jobs
    keys, at_ms = store.keys, BASE_MS + hour * HOUR_MS
    for index in (keys.all_index, keys.user_index(state.user_uid), keys.name_index(state.name)):
        # XX: only an entry the store wrote is moved; a wrong key would add nothing and fail the asserts.
        assert await store.redis.zadd(index, {job_id: at_ms}, xx=True, ch=True) == 1
    await store.redis.hset(keys.state(job_id), "created_ms", str(at_ms))  # type: ignore[misc]


def ids(page_html: str) -> list[str]:
    return re.findall(r'<tr data-job-id="([^"]+)"', page_html)


def next_link(page_html: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">', page_html)
    return None if found is None else html.unescape(found.group(1))


@pytest.fixture
async def hourly(dash: Dash) -> list[str]:
    """Six jobs created one hour apart (index = hour): even hours by u1 of SECRET_JOB (hour 4 failed),
    odd hours by u2 of OTHER_JOB; all ended."""
    made = []
    for hour in range(6):
        if hour % 2:
            made.append(await dash.enqueue(OTHER_JOB, user="u2"))
        else:
            made.append(await dash.enqueue(user="u1", fail=hour == 4))
    await dash.drain()
    for hour, job_id in enumerate(made):
        await created_at(dash, job_id, hour)
    return made


async def get_ok(client: DashClient, query: str) -> str:
    response = await client.get(f"/admin/ui/jobs?{query}")
    assert response.status_code == 200, (query, await response.get_data(as_text=True))
    return str(await response.get_data(as_text=True))


async def test_newest_first_by_default_and_oldest_first_on_request(dash: Dash, hourly: list[str]) -> None:
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    assert ids(await get_ok(client, "")) == hourly[::-1]
    assert ids(await get_ok(client, "sort=newest")) == hourly[::-1]
    oldest = await get_ok(client, "sort=oldest")
    assert ids(oldest) == hourly
    assert '<option value="oldest" selected>' in oldest  # the form keeps the choice
    # Each filtered index is read in the same order.
    assert ids(await get_ok(client, "sort=OLDEST&user=u2")) == hourly[1::2]
    assert ids(await get_ok(client, f"sort=oldest&job={SECRET_JOB}")) == hourly[0::2]
    # A terminal status alone is read from its status index, ordered by the end: the two orders mirror.
    ended_oldest = ids(await get_ok(client, "sort=oldest&status=SUCCESS"))
    assert sorted(ended_oldest) == sorted(hourly[h] for h in (0, 1, 2, 3, 5))
    assert ids(await get_ok(client, "status=SUCCESS")) == ended_oldest[::-1]


async def test_the_creation_window_keeps_since_and_drops_until(dash: Dash, hourly: list[str]) -> None:
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    # What an <input type="datetime-local"> sends: no zone, read as UTC; `since` is in, `until` is out.
    page = await get_ok(client, "since=2026-01-01T01:00&until=2026-01-01T04:00")
    assert ids(page) == [hourly[3], hourly[2], hourly[1]]
    assert 'name="since" value="2026-01-01T01:00"' in page and 'name="until" value="2026-01-01T04:00"' in page
    # ISO 8601 with a zone, converted to UTC (03:00+02:00 is 01:00 UTC) and shown as UTC in the form.
    page = await get_ok(client, "since=2026-01-01T03:00%2B02:00&sort=oldest")
    assert ids(page) == hourly[1:]
    assert 'name="since" value="2026-01-01T01:00"' in page
    assert ids(await get_ok(client, "until=2026-01-01T02:00:00Z")) == [hourly[1], hourly[0]]
    # One millisecond past an hour leaves that hour's job out.
    assert ids(await get_ok(client, "since=2026-01-01T04:00:00.001Z")) == [hourly[5]]
    # A window nothing was created in.
    empty = await get_ok(client, "since=2025-06-01T00:00&until=2025-07-01T00:00")
    assert ids(empty) == [] and "No job matches." in empty


async def test_the_window_combines_with_the_other_filters(dash: Dash, hourly: list[str]) -> None:
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    window = "since=2026-01-01T01:00&until=2026-01-01T05:00"
    assert ids(await get_ok(client, f"{window}&user=u1")) == [hourly[4], hourly[2]]
    assert ids(await get_ok(client, f"{window}&job={OTHER_JOB}&sort=oldest")) == [hourly[1], hourly[3]]
    # The status indexes are not scored by creation: with a window the status is checked per job.
    assert ids(await get_ok(client, f"{window}&status=FAILURE")) == [hourly[4]]
    assert ids(await get_ok(client, f"{window}&status=SUCCESS&user=u1")) == [hourly[2]]
    assert ids(await get_ok(client, f"{window}&status=PENDING")) == []
    queued = await dash.enqueue(OTHER_JOB, user="u2")
    await created_at(dash, queued, 2)
    assert ids(await get_ok(client, f"{window}&status=PENDING")) == [queued]
    assert ids(await get_ok(client, "status=PENDING")) == [queued]


async def test_paging_follows_the_order_and_keeps_the_filters(
    dash: Dash, hourly: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.dashboard.views.PAGE_SIZE", 2)
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    for query, expected in [
        ("sort=oldest", hourly),
        ("", hourly[::-1]),
        ("sort=oldest&since=2026-01-01T01:00&until=2026-01-01T06:00", hourly[1:]),
        ("since=2026-01-01T01:00&until=2026-01-01T05:00", hourly[4:0:-1]),
        ("sort=oldest&user=u1&since=2026-01-01T01:00", [hourly[2], hourly[4]]),
        ("sort=oldest&status=SUCCESS&since=2026-01-01T00:00", [hourly[h] for h in (0, 1, 2, 3, 5)]),
        ("status=SUCCESS&user=u2&until=2026-01-01T06:00", [hourly[5], hourly[3], hourly[1]]),
    ]:
        seen: list[str] = []
        link: str | None = f"/admin/ui/jobs?{query}"
        pages = 0
        while link is not None:
            assert link.startswith("/admin/ui/jobs?")
            page = await get_ok(client, link.split("?", 1)[1])
            assert len(ids(page)) <= 2
            seen += ids(page)
            link = next_link(page)
            pages += 1
            if link is not None:
                # The link carries every filter of the page it is on, plus the cursor.
                carried = parse_qs(urlsplit(link).query)
                assert carried.pop("cursor") and carried == parse_qs(query), (query, link)
                assert "Newer »" in page if "sort=oldest" in query else "Older »" in page
            assert pages <= len(expected), "paging does not end"
        assert seen == expected, query


async def test_library_pages_of_a_window_count_from_the_window(dash: Dash, hourly: list[str]) -> None:
    """The cursor is a position from the window's first entry: jobs created after the window do not move it."""
    listing = dash.runtime.client.listing
    since_ms, until_ms = BASE_MS + HOUR_MS, BASE_MS + 5 * HOUR_MS
    first = await listing.list_page(
        order=JobOrder.NEWEST, limit=2, created_since_ms=since_ms, created_until_ms=until_ms
    )
    assert [s.job_id for s in first.states] == [hourly[4], hourly[3]] and first.next_cursor == 2
    later = await dash.enqueue(user="u1")  # now: after the window, first in the newest-first index
    assert later
    second = await listing.list_page(
        order=JobOrder.NEWEST, limit=2, cursor=2, created_since_ms=since_ms, created_until_ms=until_ms
    )
    assert [s.job_id for s in second.states] == [hourly[2], hourly[1]] and second.next_cursor is None
    oldest = await listing.list_page(
        order=JobOrder.OLDEST, limit=3, cursor=1, created_since_ms=since_ms, created_until_ms=until_ms
    )
    assert [s.job_id for s in oldest.states] == [hourly[2], hourly[3], hourly[4]] and oldest.next_cursor is None


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sort=random", "sort must be one of newest, oldest"),
        ("since=yesterday", "since must be a time"),
        ("until=2026-13-01T00:00", "until must be a time"),
        ("since=2026-01-01T25:00", "since must be a time"),
        ("since=" + "1" * 50, "since must be 1-40 printable characters"),
        ("since=1969-12-31T23:59", "since must be after 1970-01-01"),
        ("since=0001-01-01T00:00%2B05:00", "since must be a time"),
        ("since=2026-01-01T02:00&until=2026-01-01T01:00", "since must be before until"),
        ("since=2026-01-01T01:00&until=2026-01-01T03:00%2B02:00", "since must be before until"),
    ],
)
async def test_a_bad_sort_or_time_is_422_with_its_reason(dash: Dash, query: str, message: str) -> None:
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    response = await client.get(f"/admin/ui/jobs?{query}")
    assert response.status_code == 422
    assert message in html.unescape(await response.get_data(as_text=True))


async def test_a_viewer_filters_and_sorts_and_gets_no_action(dash: Dash, hourly: list[str]) -> None:
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    page = await get_ok(client, f"job={SECRET_JOB}&sort=oldest&since=2026-01-01T00:00&until=2026-01-01T03:00")
    assert ids(page) == [hourly[0], hourly[2]]
    assert "Bulk:" not in page and "bulk?" not in page
    assert 'type="datetime-local" name="since"' in page and "<script>" not in page and "style=" not in page
    # The list only reads: the jobs are as they were.
    assert [await dash.status(j) for j in hourly] == [
        JobStatus.SUCCESS, JobStatus.SUCCESS, JobStatus.SUCCESS, JobStatus.SUCCESS, JobStatus.FAILURE,
        JobStatus.SUCCESS,
    ]
    operator, _ = await dash.signed_in(DashboardRole.OPERATOR, uid="ops-bob")
    assert "Bulk:" in await get_ok(operator, f"job={SECRET_JOB}&sort=oldest&since=2026-01-01T00:00")
