"""The Idempotency-Key header of the operations that queue a job: a client's retry gets the first
request's job (202, `Idempotent-Replayed: true`), never a second job; a key reused for another
request is refused. Real app, real Redis and database, a real worker."""

from __future__ import annotations

import asyncio

import pytest

from agent_async import JobStatus
from tests.app.conftest import Api, ics_with_events
from tests.app.test_export_import import new_calendar


def _keyed(api: Api, uid: str, key: str, *, admin: bool = False) -> dict[str, str]:
    return {**api.headers(uid, admin=admin), "Idempotency-Key": key}


async def _import(api: Api, uid: str, calendar: str, ics: str, key: str) -> tuple[int, str | None, dict[str, str]]:
    """The status, the Idempotent-Replayed header and the body of an import sent with `key`."""
    headers = {**_keyed(api, uid, key), "Content-Type": "text/calendar"}
    response = await api.client.post(f"/calendars/{calendar}/import", data=ics.encode(), headers=headers)
    return response.status_code, response.headers.get("Idempotent-Replayed"), await response.get_json()


async def test_an_export_sent_again_with_its_key_is_the_same_job(api: Api, user: str, other_user: str) -> None:
    calendar = await new_calendar(api, user)
    first = await api.client.post(f"/calendars/{calendar}/export", headers=_keyed(api, user, "export-1"))
    again = await api.client.post(f"/calendars/{calendar}/export", headers=_keyed(api, user, "export-1"))
    assert (first.status_code, again.status_code) == (202, 202)
    job_id = (await first.get_json())["job_id"]
    assert (await again.get_json())["job_id"] == job_id
    assert "Idempotent-Replayed" not in first.headers and again.headers["Idempotent-Replayed"] == "true"
    # Without the key, the same request is a new job (the concurrency limit of one export at a
    # time refuses it while the first is queued).
    plain = await api.client.post(f"/calendars/{calendar}/export", headers=api.headers(user))
    assert plain.status_code == 409
    await api.drain()
    assert (await api.state(job_id)).status is JobStatus.SUCCESS
    listed = await api.client.get("/jobs", headers=api.headers(user))
    assert [item["job_id"] for item in (await listed.get_json())["jobs"]] == [job_id]
    # Another user's key of the same text names another job (and theirs is their calendar's).
    theirs = await new_calendar(api, other_user)
    other = await api.client.post(f"/calendars/{theirs}/export", headers=_keyed(api, other_user, "export-1"))
    assert other.status_code == 202 and (await other.get_json())["job_id"] != job_id


async def test_an_import_sent_again_saves_its_file_once(api: Api, user: str) -> None:
    calendar = await new_calendar(api, user)
    store = api.runtime.client.get_large_store()
    before = set(await store.list_references(limit=100_000))
    ics = ics_with_events(3)
    status, _, body = await _import(api, user, calendar, ics, "import-1")
    assert status == 202
    status, replayed, again = await _import(api, user, calendar, ics, "import-1")
    assert status == 202 and again == body and replayed == "true"
    assert len(set(await store.list_references(limit=100_000)) - before) == 1, "one upload saved"
    # The same key with another file: refused, and that file is not kept.
    status, _, refused = await _import(api, user, calendar, ics_with_events(4), "import-1")
    assert status == 422 and refused["error"] == "idempotency_key_reused"
    assert len(set(await store.list_references(limit=100_000)) - before) == 1
    await api.drain()
    state = await api.state(body["job_id"])
    assert state.status is JobStatus.SUCCESS and state.result == {"imported": 3, "updated": 0, "skipped": 0}
    view = await api.client.get(f"/jobs/{body['job_id']}", headers=api.headers(user))
    assert (await view.get_json())["payload"] == {"calendar_key": calendar}, "the digest is not shown"


async def test_an_import_sent_twice_at_once_is_one_job_and_one_file(api: Api, user: str) -> None:
    """Both requests save their upload before either is queued: the one that loses the race drops
    its file and answers with the winner's job."""
    calendar = await new_calendar(api, user)
    store = api.runtime.client.get_large_store()
    before = set(await store.list_references(limit=100_000))
    ics = ics_with_events(2)
    answers = await asyncio.gather(*(_import(api, user, calendar, ics, "import-2") for _ in range(2)))
    assert [status for status, _, _ in answers] == [202, 202]
    assert answers[0][2] == answers[1][2]
    assert sorted(replayed or "" for _, replayed, _ in answers) == ["", "true"]
    assert len(set(await store.list_references(limit=100_000)) - before) == 1


@pytest.mark.parametrize("key", ["x" * 256, "two words", "caf\u00e9"])
async def test_a_malformed_key_is_422_and_queues_nothing(api: Api, user: str, key: str) -> None:
    calendar = await new_calendar(api, user)
    headers = {**api.headers(user), "Idempotency-Key": key}
    response = await api.client.post(f"/calendars/{calendar}/export", headers=headers)
    assert response.status_code == 422
    body = await response.get_json()
    assert body["error"] == "invalid_body" and "idempotency" in body["message"].lower()
    listed = await api.client.get("/jobs", headers=api.headers(user))
    assert (await listed.get_json())["jobs"] == []


async def test_the_admin_sweep_with_a_key_is_queued_once(api: Api, user: str) -> None:
    admin = _keyed(api, "admin-1", "sweep-1", admin=True)
    first = await api.client.post("/admin/sync/external", headers=admin)
    again = await api.client.post("/admin/sync/external", headers=admin)
    assert (first.status_code, again.status_code) == (202, 202)
    assert (await first.get_json()) == (await again.get_json())
    assert again.headers["Idempotent-Replayed"] == "true"
    # Another admin's sweep under the same key is another request (its requester differs).
    other = await api.client.post("/admin/sync/external", headers=_keyed(api, "admin-2", "sweep-1", admin=True))
    assert other.status_code == 422 and (await other.get_json())["error"] == "idempotency_key_reused"
