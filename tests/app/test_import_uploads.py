"""An import's uploaded file is deleted when the import ends in any way, not only on success, so
repeating cancelled imports cannot fill the store."""

from __future__ import annotations

from agent_async import JobStatus
from tests.app.conftest import Api, ics_with_events
from tests.app.test_export_import import new_calendar, start_import


async def upload_count(api: Api) -> int:
    return len(await api.runtime.agent.get_large_store().list_references())


async def test_cancelled_import_deletes_its_upload(api: Api, user: str) -> None:
    key = await new_calendar(api, user)
    before = await upload_count(api)
    for _ in range(3):  # cancel, import again, cancel again: nothing piles up
        job_id = await start_import(api, user, key, ics_with_events(2))
        assert await upload_count(api) == before + 1
        response = await api.client.post(f"/jobs/{job_id}/cancel", headers=api.headers(user))
        assert response.status_code == 200, await response.get_data()
        assert (await api.state(job_id)).status is JobStatus.CANCELED
        assert await upload_count(api) == before

