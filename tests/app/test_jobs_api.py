"""The /jobs endpoints: ownership, the public view, listing, cancellation."""

from __future__ import annotations

from agent_async import JobStatus
from app.module.calendar.repository import CalendarRepository
from app.module.calendar.requests import JobRequestExportIcs
from tests.app.conftest import Api, ics_with_events
from tests.app.test_export_import import new_calendar, start_import

INTERNAL_FIELDS = {"job_id", "name", "user_uid", "attempts", "schedule_name", "created_at", "started_at",
                   "finished_at", "created_ms", "started_ms", "finished_ms"}


async def test_public_view_has_only_owner_facing_fields(api: Api, user: str) -> None:
    """GET /jobs/<id> shows status, payload, result, error and never the internal fields."""
    key = await new_calendar(api, user)
    job_id = await start_import(api, user, key, ics_with_events(2))
    await api.drain()
    response = await api.client.get(f"/jobs/{job_id}", headers=api.headers(user))
    body = await response.get_json()
    assert set(body) == {"status", "payload", "result", "error", "progress"}
    assert not INTERNAL_FIELDS & set(body)
    raw = (await response.get_data()).decode()
    assert job_id not in raw and user not in raw and "calendar.import.ics" not in raw
    assert "agent:file:" not in raw, "no storage locator leaks through payload or result"


async def test_another_users_job_is_403_and_unknown_is_404(api: Api, user: str, other_user: str) -> None:
    """Ownership on every /jobs endpoint: 403 for another user's job, 404 for an unknown id."""
    key = await new_calendar(api, user)
    job_id = (await (await api.client.post(f"/calendars/{key}/export", headers=api.headers(user))).get_json())["job_id"]
    for method, path in (("GET", f"/jobs/{job_id}"), ("GET", f"/jobs/{job_id}/result"),
                         ("POST", f"/jobs/{job_id}/cancel")):
        response = await api.client.open(path, method=method, headers=api.headers(other_user))
        assert response.status_code == 403, (method, path)
        assert (await response.get_json())["error"] == "forbidden"
    assert (await api.state(job_id)).status is JobStatus.PENDING, "the other user's cancel did nothing"
    unknown = await api.client.get("/jobs/0123456789abcdef", headers=api.headers(user))
    assert unknown.status_code == 404
    assert await unknown.get_json() == {"error": "job_not_found", "message": "no job 0123456789abcdef"}


async def test_system_jobs_are_hidden_from_users_and_shown_to_admins(api: Api, user: str) -> None:
    """A job without a user (a scheduled run, say) answers 404 to users, as if it did not exist;
    an admin token reads its public view."""
    job_id = await api.runtime.client.enqueue(JobRequestExportIcs(calendar_key="x"))
    response = await api.client.get(f"/jobs/{job_id}", headers=api.headers(user))
    assert response.status_code == 404
    listed = await (await api.client.get("/jobs", headers=api.headers(user))).get_json()
    assert listed["jobs"] == []
    response = await api.client.get(f"/jobs/{job_id}", headers=api.headers("root", admin=True))
    assert response.status_code == 200
    assert (await response.get_json())["status"] == "PENDING"


async def test_list_is_newest_first_and_paginated(api: Api, user: str, other_user: str) -> None:
    """GET /jobs lists only the caller's jobs, newest first, with offset/limit and a total."""
    key = await new_calendar(api, user)
    ids = []
    for n in range(3):
        ids.append(await start_import(api, user, key, ics_with_events(1, prefix=f"p{n}")))
        await api.drain()
    other_key = await new_calendar(api, other_user)
    await start_import(api, other_user, other_key, ics_with_events(1))
    page = await (await api.client.get("/jobs?offset=0&limit=2", headers=api.headers(user))).get_json()
    assert [item["job_id"] for item in page["jobs"]] == [ids[2], ids[1]]
    assert page["total"] == 3 and page["offset"] == 0 and page["limit"] == 2
    assert set(page["jobs"][0]["job"]) == {"status", "payload", "result", "error", "progress"}
    rest = await (await api.client.get("/jobs?offset=2&limit=2", headers=api.headers(user))).get_json()
    assert [item["job_id"] for item in rest["jobs"]] == [ids[0]]


async def test_bad_pagination_is_422(api: Api, user: str) -> None:
    """offset/limit must be bounded integers; anything else is a 422 naming the parameter."""
    for query in ("limit=0", "limit=101", "offset=-1", "limit=abc", "offset=1.5"):
        response = await api.client.get(f"/jobs?{query}", headers=api.headers(user))
        assert response.status_code == 422, query
        body = await response.get_json()
        assert body["error"] == "invalid_body" and query.split("=")[0] in body["message"]


async def test_cancel_of_a_queued_job(api: Api, user: str) -> None:
    """A queued import cancelled over HTTP ends CANCELED, never runs, and cancel is idempotent."""
    key = await new_calendar(api, user)
    job_id = await start_import(api, user, key, ics_with_events(4))
    response = await api.client.post(f"/jobs/{job_id}/cancel", headers=api.headers(user))
    assert response.status_code == 200
    body = await response.get_json()
    assert body["status"] == "CANCELED" and set(body) == {"status", "payload", "result", "error", "progress"}
    await api.drain()
    state = await api.state(job_id)
    assert state.status is JobStatus.CANCELED and state.attempts == 0 and state.started_ms is None
    assert await CalendarRepository(api.runtime.engine).count_events(key) == 0
    again = await api.client.post(f"/jobs/{job_id}/cancel", headers=api.headers(user))
    assert again.status_code == 200 and (await again.get_json())["status"] == "CANCELED"


async def test_cancel_of_a_finished_job_leaves_it_unchanged(api: Api, user: str) -> None:
    """Cancelling a job that already succeeded returns its SUCCESS view unchanged."""
    key = await new_calendar(api, user)
    job_id = await start_import(api, user, key, ics_with_events(1))
    await api.drain()
    response = await api.client.post(f"/jobs/{job_id}/cancel", headers=api.headers(user))
    assert response.status_code == 200
    body = await response.get_json()
    assert body["status"] == "SUCCESS" and body["result"] == {"imported": 1, "updated": 0, "skipped": 0}
