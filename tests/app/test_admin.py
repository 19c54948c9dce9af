"""Admin: schedules listed and changed at runtime over HTTP; the large-store cleanup job."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from agent_async import JobStatus
from agent_async.storage import ClientStorageDatabase, StorageSource
from app.module.admin.requests import JobRequestCleanupLargeStore
from tests.app.conftest import Api
from tests.conftest import running_worker

CLEANUP = JobRequestCleanupLargeStore.name


async def schedules(api: Api) -> dict[str, dict]:  # type: ignore[type-arg]
    response = await api.client.get("/admin/schedules", headers=api.headers("root", admin=True))
    assert response.status_code == 200
    return {s["name"]: s for s in (await response.get_json())["schedules"]}


async def test_schedules_are_listed_for_admins_only(api: Api, user: str) -> None:
    assert (await api.client.get("/admin/schedules", headers=api.headers(user))).status_code == 403
    assert (await api.client.get("/admin/schedules")).status_code == 401
    cleanup = (await schedules(api))[CLEANUP]
    assert cleanup["default_cron"] == cleanup["effective_cron"] == "30 3 * * *"
    assert cleanup["enabled"] is True and cleanup["override"] is None and cleanup["last_run"] is None
    assert cleanup["next_run"].endswith("03:30:00+00:00")


async def test_patch_disables_replaces_and_restores_with_a_change_log(api: Api, user: str) -> None:
    root = api.headers("root", admin=True)
    response = await api.client.patch(f"/admin/schedules/{CLEANUP}", json={"enabled": False}, headers=root)
    assert response.status_code == 200
    body = await response.get_json()
    assert body["enabled"] is False and body["disabled_reason"] == "disabled by root" and body["next_run"] is None
    response = await api.client.patch(
        f"/admin/schedules/{CLEANUP}", json={"enabled": True, "cron": "0 * * * *"}, headers=root
    )
    body = await response.get_json()
    assert body["effective_cron"] == "0 * * * *" and body["enabled"] is True
    response = await api.client.patch(f"/admin/schedules/{CLEANUP}", json={"cron": None}, headers=root)
    assert (await response.get_json())["effective_cron"] == "30 3 * * *"
    changes = await api.runtime.agent.scheduler.overrides.changes(CLEANUP)
    assert [(c.changed_by, c.change) for c in changes] == [
        ("root", {"cron": None}),
        ("root", {"enabled": True, "cron": "0 * * * *"}),
        ("root", {"enabled": False}),
    ]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"cron": "61 * * * *"}, 422, "invalid_cron"),
        ({"cron": "0 0 L * *"}, 422, "invalid_cron"),
        ({"cron": 5}, 422, "invalid_cron"),
        ({"enabled": "yes"}, 422, "invalid_body"),
        ({"when": "now"}, 422, "invalid_body"),
        ({}, 422, "invalid_body"),
    ],
)
async def test_patch_refuses_bad_input_with_the_reason(api: Api, body: dict, status: int, code: str) -> None:  # type: ignore[type-arg]
    response = await api.client.patch(f"/admin/schedules/{CLEANUP}", json=body, headers=api.headers("r", admin=True))
    assert response.status_code == status
    payload = await response.get_json()
    assert payload["error"] == code and payload["message"]
    if body.get("cron") == "61 * * * *":
        assert "61" in payload["message"], "the parser's reason is passed on"
    assert (await schedules(api))[CLEANUP]["override"] is None, "nothing was stored"


async def test_patch_of_unknown_schedule_or_by_a_user(api: Api, user: str) -> None:
    root = api.headers("root", admin=True)
    assert (await api.client.patch("/admin/schedules/nope", json={"enabled": False}, headers=root)).status_code == 404
    response = await api.client.patch(f"/admin/schedules/{CLEANUP}", json={"enabled": False}, headers=api.headers(user))
    assert response.status_code == 403


async def test_cleanup_purges_only_old_agent_blobs(api: Api) -> None:
    """The cleanup run deletes agent blobs past the max age; recent ones and other owners' stay."""
    settings = api.runtime.agent.settings
    url = settings.database_url
    long_ago = datetime(2020, 1, 1, tzinfo=UTC).timestamp()
    old_agent = ClientStorageDatabase(StorageSource.AGENT, database_url=url, clock=lambda: long_ago)
    old_contact = ClientStorageDatabase(StorageSource.CONTACT, database_url=url, clock=lambda: long_ago)
    fresh_agent = ClientStorageDatabase(StorageSource.AGENT, database_url=url)
    old_ref = await old_agent.save(b"old result", "text/plain")
    contact_ref = await old_contact.save(b"photo", "image/png")
    fresh_ref = await fresh_agent.save(b"new result", "text/plain")
    fire_at = datetime(2026, 11, 30, 3, 30, tzinfo=UTC)
    assert await api.runtime.agent.scheduler.fire(CLEANUP, fire_at) == "enqueued"
    await api.drain()
    runs = await api.runtime.client.list_by_schedule(CLEANUP)
    assert len(runs) == 1 and runs[0].status is JobStatus.SUCCESS
    assert runs[0].result is not None and runs[0].result["purged"] >= 1
    assert await fresh_agent.load(fresh_ref) is not None
    assert await old_contact.load(contact_ref) is not None
    assert await old_agent.load(old_ref) is None
    for store in (old_agent, old_contact, fresh_agent):
        await store.close()
    # The scheduled run is visible to an admin through the jobs API.
    response = await api.client.get(f"/jobs/{runs[0].job_id}", headers=api.headers("root", admin=True))
    assert (await response.get_json())["result"]["purged"] == runs[0].result["purged"]


async def test_patch_answers_the_view_the_list_shows(api: Api) -> None:
    """PATCH answers the same object as the list's item, `recent_skips` included."""
    root = api.headers("root", admin=True)
    await api.client.patch(f"/admin/schedules/{CLEANUP}", json={"enabled": False}, headers=root)
    assert await api.runtime.agent.scheduler.fire(CLEANUP, datetime(2026, 11, 30, 3, 30, tzinfo=UTC)) == "disabled"
    response = await api.client.patch(f"/admin/schedules/{CLEANUP}", json={"cron": "0 4 * * *"}, headers=root)
    assert response.status_code == 200
    patched = await response.get_json()
    assert patched == (await schedules(api))[CLEANUP]
    assert patched["recent_skips"][0]["reason"] == "disabled by root"


async def test_disabled_and_reenabled_on_a_running_worker(api: Api) -> None:
    """The note's scenario: a schedule disabled, then re-enabled, through the API while a worker
    runs, takes effect at the next tick without a restart."""
    root = api.headers("root", admin=True)
    agent = api.runtime.agent
    async with running_worker(agent):
        await api.client.patch(f"/admin/schedules/{CLEANUP}", json={"enabled": False}, headers=root)
        tick = datetime(2026, 11, 30, 3, 30, tzinfo=UTC)
        assert await agent.scheduler.fire(CLEANUP, tick) == "disabled"
        await api.client.patch(f"/admin/schedules/{CLEANUP}", json={"enabled": True}, headers=root)
        assert await agent.scheduler.fire(CLEANUP, tick) == "enqueued"
        for _ in range(200):
            runs = await api.runtime.client.list_by_schedule(CLEANUP)
            if runs and runs[0].is_terminal:
                break
            await asyncio.sleep(0.05)
    assert runs and runs[0].status is JobStatus.SUCCESS
    listed = (await schedules(api))[CLEANUP]
    assert listed["last_run"]["job_id"] == runs[0].job_id
    assert listed["recent_skips"][0]["reason"] == "disabled by root"


@pytest.mark.parametrize("body", [b"{not json", b"", b'{"enabled": fals}'], ids=["malformed", "empty", "bad-literal"])
async def test_patch_with_unparseable_json_is_400(api: Api, body: bytes) -> None:
    """Unparseable JSON is a 400 bad_request, as on every endpoint (docs/api.md); a well-formed body
    with wrong fields stays a 422 (test_patch_refuses_bad_input_with_the_reason)."""
    headers = {**api.headers("root", admin=True), "Content-Type": "application/json"}
    response = await api.client.patch(f"/admin/schedules/{CLEANUP}", data=body, headers=headers)
    assert response.status_code == 400
    payload = await response.get_json()
    assert payload["error"] == "bad_request" and "not parseable JSON" in payload["message"]
    assert (await schedules(api))[CLEANUP]["override"] is None, "nothing was stored"


async def test_patch_without_a_json_content_type_is_422(api: Api) -> None:
    """A body not declared as JSON is not read as JSON: the object the endpoint needs is missing."""
    response = await api.client.patch(f"/admin/schedules/{CLEANUP}", data=b'{"enabled": false}',
                                      headers={**api.headers("root", admin=True), "Content-Type": "text/plain"})
    assert response.status_code == 422
    assert (await response.get_json())["error"] == "invalid_body"
