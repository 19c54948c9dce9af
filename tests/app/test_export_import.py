"""ICS export and import through the HTTP API with a real worker, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import icalendar
from werkzeug.datastructures import FileStorage

from agent_async import JobStatus
from app.module.calendar.repository import CalendarRepository
from tests.app.conftest import Api, ics_with_events


async def new_calendar(api: Api, uid: str, name: str = "Work") -> str:
    response = await api.client.post("/calendars", json={"name": name}, headers=api.headers(uid))
    assert response.status_code == 201, await response.get_data()
    key: str = (await response.get_json())["key"]
    return key


async def add_event(api: Api, uid: str, key: str, **fields: Any) -> dict[str, Any]:
    response = await api.client.post(f"/calendars/{key}/events", json=fields, headers=api.headers(uid))
    assert response.status_code == 201, await response.get_data()
    body: dict[str, Any] = await response.get_json()
    return body


async def job_view(api: Api, uid: str, job_id: str) -> dict[str, Any]:
    response = await api.client.get(f"/jobs/{job_id}", headers=api.headers(uid))
    assert response.status_code == 200, await response.get_data()
    body: dict[str, Any] = await response.get_json()
    return body


async def start_import(api: Api, uid: str, key: str, ics: str) -> str:
    response = await api.client.post(
        f"/calendars/{key}/import", data=ics.encode(), headers={**api.headers(uid), "Content-Type": "text/calendar"}
    )
    assert response.status_code == 202, await response.get_data()
    job_id: str = (await response.get_json())["job_id"]
    return job_id


async def test_export_round_trip(api: Api, user: str) -> None:
    """Create a calendar and events, export, poll to SUCCESS, fetch the ICS and parse the same events back."""
    key = await new_calendar(api, user, "Team / Q1")
    sent = [
        await add_event(api, user, key, summary="Planning", start="2030-03-01T09:00:00Z", end="2030-03-01T10:00:00Z",
                        description="Room 4"),
        await add_event(api, user, key, summary="Retro", start="2030-03-02T15:30:00+02:00",
                        end="2030-03-02T16:00:00+02:00"),
    ]
    response = await api.client.post(f"/calendars/{key}/export", headers=api.headers(user))
    assert response.status_code == 202
    job_id = (await response.get_json())["job_id"]
    assert (await job_view(api, user, job_id))["status"] == "PENDING"

    await api.drain()

    view = await job_view(api, user, job_id)
    assert view["status"] == "SUCCESS", view
    assert view["result"] == {"filename": "Team-Q1.ics", "events": 2}, "large_result is never shown"
    result = await api.client.get(f"/jobs/{job_id}/result?download=true", headers=api.headers(user))
    assert result.status_code == 200
    assert result.headers["Content-Type"].startswith("text/calendar")
    assert result.headers["Content-Disposition"] == 'attachment; filename=Team-Q1.ics'
    body = await result.get_data()
    assert int(result.headers["Content-Length"]) == len(body)
    parsed = icalendar.Calendar.from_ical(body)
    got = sorted(
        (str(e["UID"]), str(e["SUMMARY"]), e.decoded("DTSTART").isoformat(), e.decoded("DTEND").isoformat())
        for e in parsed.walk("VEVENT")
    )
    want = sorted((e["uid"], e["summary"], e["start"], e["end"]) for e in sent)
    assert got == want
    assert str(parsed["X-WR-CALNAME"]) == "Team / Q1"
    inline = await api.client.get(f"/jobs/{job_id}/result", headers=api.headers(user))
    assert inline.status_code == 200 and "Content-Disposition" not in inline.headers


async def test_import_100_events_then_reimport_is_idempotent(api: Api, user: str) -> None:
    """100 events import once; the same file again imports nothing and duplicates nothing."""
    key = await new_calendar(api, user)
    ics = ics_with_events(100)
    job_id = await start_import(api, user, key, ics)
    view = await job_view(api, user, job_id)
    assert "source_ref" not in view["payload"] and view["payload"] == {"calendar_key": key}
    source_ref = (await api.state(job_id)).payload["source_ref"]
    assert await api.runtime.client.get_large_store().load_text(source_ref) == ics, "saved before enqueue"

    await api.drain()

    view = await job_view(api, user, job_id)
    assert view["status"] == "SUCCESS", view
    assert view["result"] == {"imported": 100, "updated": 0, "skipped": 0}
    assert await api.runtime.client.get_large_store().load(source_ref) is None, "the upload is single-use"

    again = await start_import(api, user, key, ics)
    await api.drain()
    view = await job_view(api, user, again)
    assert view["result"] == {"imported": 0, "updated": 0, "skipped": 100}

    repository = CalendarRepository(api.runtime.engine)
    assert await repository.count_events(key) == 100
    events = await repository.list_events(key)
    assert len({e.uid for e in events}) == 100
    listed = await api.client.get(f"/calendars/{key}/events?limit=100", headers=api.headers(user))
    assert (await listed.get_json())["total"] == 100


async def test_reimport_of_a_changed_file_updates_by_uid(api: Api, user: str) -> None:
    """Changed events (same UID) count as updated, new UIDs as imported, the rest skipped."""
    key = await new_calendar(api, user)
    await start_import(api, user, key, ics_with_events(3))
    await api.drain()
    changed = ics_with_events(4).replace("SUMMARY:Event 1", "SUMMARY:Event one (moved)")
    job_id = await start_import(api, user, key, changed)
    await api.drain()
    assert (await job_view(api, user, job_id))["result"] == {"imported": 1, "updated": 1, "skipped": 2}
    summaries = {e.summary for e in await CalendarRepository(api.runtime.engine).list_events(key)}
    assert "Event one (moved)" in summaries and "Event 1" not in summaries


async def test_import_as_multipart_file(api: Api, user: str) -> None:
    """A multipart/form-data upload with a `file` part imports like a raw text/calendar body."""
    key = await new_calendar(api, user)
    upload = FileStorage(
        stream=__import__("io").BytesIO(ics_with_events(5).encode()), filename="cal.ics", content_type="text/calendar"
    )
    response = await api.client.post(f"/calendars/{key}/import", files={"file": upload}, headers=api.headers(user))
    assert response.status_code == 202, await response.get_data()
    job_id = (await response.get_json())["job_id"]
    await api.drain()
    assert (await job_view(api, user, job_id))["result"] == {"imported": 5, "updated": 0, "skipped": 0}


async def test_invalid_ics_fails_fast_with_a_clear_error(api: Api, user: str) -> None:
    """A file that is not iCalendar ends FAILURE after one attempt, says why, and its blob is deleted."""
    key = await new_calendar(api, user)
    job_id = await start_import(api, user, key, "this is not a calendar\r\n")
    source_ref = (await api.state(job_id)).payload["source_ref"]
    await api.drain()
    view = await job_view(api, user, job_id)
    assert view["status"] == "FAILURE"
    assert view["error"].startswith("InvalidIcsError: not an iCalendar file")
    state = await api.state(job_id)
    assert state.attempts == 1
    assert await api.runtime.client.get_large_store().load(source_ref) is None
    assert await CalendarRepository(api.runtime.engine).count_events(key) == 0


async def test_event_without_dtstart_is_rejected_by_name(api: Api, user: str) -> None:
    """An ICS event missing DTSTART fails the import naming the event and the property."""
    key = await new_calendar(api, user)
    ics = "\r\n".join(
        ["BEGIN:VCALENDAR", "VERSION:2.0", "BEGIN:VEVENT", "UID:x@test", "SUMMARY:No start", "END:VEVENT",
         "END:VCALENDAR", ""]
    )
    job_id = await start_import(api, user, key, ics)
    await api.drain()
    state = await api.state(job_id)
    assert state.status is JobStatus.FAILURE and state.attempts == 1
    assert state.error == "InvalidIcsError: event #1: DTSTART is missing"


async def test_second_concurrent_export_is_409(api: Api, user: str) -> None:
    """max_concurrent 1 per user: a second export while the first is queued is refused with 409."""
    key = await new_calendar(api, user)
    first = await api.client.post(f"/calendars/{key}/export", headers=api.headers(user))
    second = await api.client.post(f"/calendars/{key}/export", headers=api.headers(user))
    assert first.status_code == 202
    assert second.status_code == 409
    assert (await second.get_json())["error"] == "job_concurrent_limit"
    await api.drain()
    third = await api.client.post(f"/calendars/{key}/export", headers=api.headers(user))
    assert third.status_code == 202, "the slot is free again once the first export finished"


async def test_result_is_410_once_the_blob_is_purged(api: Api, user: str) -> None:
    """A large result that no longer loads is a clean 410, not a 500."""
    key = await new_calendar(api, user)
    job_id = (await (await api.client.post(f"/calendars/{key}/export", headers=api.headers(user))).get_json())["job_id"]
    await api.drain()
    state = await api.state(job_id)
    assert state.result is not None
    await api.runtime.client.get_large_store().delete(state.result["large_result"])
    response = await api.client.get(f"/jobs/{job_id}/result", headers=api.headers(user))
    assert response.status_code == 410
    assert (await response.get_json())["error"] == "result_gone"


async def test_result_before_finish_is_409_and_without_large_result_410(api: Api, user: str) -> None:
    """Not finished yet: 409 job_not_finished; a job whose result is inline only: 410 no_large_result."""
    key = await new_calendar(api, user)
    export_id = (await (await api.client.post(f"/calendars/{key}/export", headers=api.headers(user))).get_json())[
        "job_id"
    ]
    early = await api.client.get(f"/jobs/{export_id}/result", headers=api.headers(user))
    assert early.status_code == 409
    assert (await early.get_json())["error"] == "job_not_finished"
    import_id = await start_import(api, user, key, ics_with_events(1))
    await api.drain()
    inline = await api.client.get(f"/jobs/{import_id}/result", headers=api.headers(user))
    assert inline.status_code == 410
    assert (await inline.get_json())["error"] == "no_large_result"
