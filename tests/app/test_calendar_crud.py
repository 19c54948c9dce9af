"""Renaming and deleting calendars, changing and deleting events; exports that survive old rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import icalendar
import pytest

from app.module.calendar.model import Event
from app.module.calendar.repository import CalendarRepository
from tests.app.conftest import Api, ics_with_events
from tests.app.test_export_import import add_event, job_view, new_calendar, start_import

GOOD_EVENT = {"summary": "Stand-up", "start": "2030-05-01T09:00:00Z", "end": "2030-05-01T09:15:00Z",
              "description": "Daily"}


async def calendars(api: Api, uid: str) -> list[dict[str, Any]]:
    body = await (await api.client.get("/calendars", headers=api.headers(uid))).get_json()
    result: list[dict[str, Any]] = body["calendars"]
    return result


async def events(api: Api, uid: str, key: str) -> list[dict[str, Any]]:
    response = await api.client.get(f"/calendars/{key}/events?limit=100", headers=api.headers(uid))
    assert response.status_code == 200
    result: list[dict[str, Any]] = (await response.get_json())["events"]
    return result


async def export(api: Api, uid: str, key: str) -> tuple[dict[str, Any], bytes]:
    job_id = (await (await api.client.post(f"/calendars/{key}/export", headers=api.headers(uid))).get_json())["job_id"]
    await api.drain()
    view = await job_view(api, uid, job_id)
    if view["status"] != "SUCCESS":
        return view, b""
    return view, await (await api.client.get(f"/jobs/{job_id}/result", headers=api.headers(uid))).get_data()


# --- 3. Line breaks in a calendar name: refused, and harmless in rows stored before ------------------------


@pytest.mark.parametrize("name", ["Team\nA", "Team\r\nA", "Team\rA", "Team\x00A"], ids=["lf", "crlf", "cr", "nul"])
async def test_a_name_with_a_line_break_or_nul_is_422(api: Api, user: str, name: str) -> None:
    created = await api.client.post("/calendars", json={"name": name}, headers=api.headers(user))
    assert created.status_code == 422
    assert (await created.get_json())["message"].startswith("name: ")
    key = await new_calendar(api, user, "Team A")
    renamed = await api.client.patch(f"/calendars/{key}", json={"name": name}, headers=api.headers(user))
    assert renamed.status_code == 422
    assert [c["name"] for c in await calendars(api, user)] == ["Team A"]


async def test_rows_stored_before_the_rule_still_export(api: Api, user: str) -> None:
    """A name with line breaks (accepted before) made every export fail with icalendar's
    'Content line can not contain unescaped new line characters'; controls in texts are dropped."""
    repository = CalendarRepository(api.runtime.engine)
    calendar = await repository.create_calendar(user, "Old\r\nname\x1b")
    start, end = datetime(2030, 5, 1, 9, tzinfo=UTC), datetime(2030, 5, 1, 10, tzinfo=UTC)
    await repository.add_event(calendar.key, Event(
        uid="old@test", summary="multi\nline\x01", description="d\x02\r\ne", start=start, end=end
    ))
    view, body = await export(api, user, calendar.key)
    assert view["status"] == "SUCCESS", view
    parsed = icalendar.Calendar.from_ical(body)
    assert str(parsed["X-WR-CALNAME"]) == "Old name"
    [event] = parsed.walk("VEVENT")
    assert (str(event["SUMMARY"]), str(event["DESCRIPTION"])) == ("multi\nline", "d\ne")
    assert view["result"]["filename"] == "Old-name.ics"


# --- PATCH /calendars/<key> and DELETE /calendars/<key> ---------------------------------------------------------


async def test_rename_a_calendar(api: Api, user: str) -> None:
    key = await new_calendar(api, user, "Work")
    response = await api.client.patch(f"/calendars/{key}", json={"name": "  Work 2026 "}, headers=api.headers(user))
    assert response.status_code == 200
    body = await response.get_json()
    assert body["key"] == key and body["name"] == "Work 2026" and body["created_at"]
    assert [(c["key"], c["name"]) for c in await calendars(api, user)] == [(key, "Work 2026")]
    view, ics = await export(api, user, key)
    assert view["result"]["filename"] == "Work-2026.ics"
    assert str(icalendar.Calendar.from_ical(ics)["X-WR-CALNAME"]) == "Work 2026"


@pytest.mark.parametrize(
    "body", [{}, {"name": ""}, {"name": None}, {"name": 5}, {"name": "x" * 256}, {"name": "ok", "colour": "red"},
             ["name"]],
    ids=["empty", "blank", "null", "number", "too-long", "unknown-field", "not-an-object"],
)
async def test_rename_with_an_invalid_body_is_422(api: Api, user: str, body: Any) -> None:
    key = await new_calendar(api, user, "Work")
    response = await api.client.patch(f"/calendars/{key}", json=body, headers=api.headers(user))
    assert response.status_code == 422
    assert (await response.get_json())["error"] == "invalid_body"
    assert [c["name"] for c in await calendars(api, user)] == ["Work"]


async def test_delete_a_calendar_and_its_events(api: Api, user: str) -> None:
    key = await new_calendar(api, user, "Doomed")
    kept = await new_calendar(api, user, "Kept")
    await add_event(api, user, key, **GOOD_EVENT)
    await add_event(api, user, kept, **GOOD_EVENT)
    response = await api.client.delete(f"/calendars/{key}", headers=api.headers(user))
    assert response.status_code == 204 and await response.get_data() == b""
    assert [c["key"] for c in await calendars(api, user)] == [kept]
    repository = CalendarRepository(api.runtime.engine)
    assert await repository.count_events(key) == 0, "its events are gone too (SQLite has no FK cascade here)"
    assert await repository.count_events(kept) == 1
    for method, path in (("GET", f"/calendars/{key}/events"), ("DELETE", f"/calendars/{key}"),
                         ("PATCH", f"/calendars/{key}")):
        body = {"name": "x"} if method == "PATCH" else None
        gone = await api.client.open(path, method=method, json=body, headers=api.headers(user))
        assert gone.status_code == 404, (method, path)
        assert (await gone.get_json())["error"] == "calendar_not_found"


async def test_an_import_queued_for_a_deleted_calendar_fails_cleanly(api: Api, user: str) -> None:
    key = await new_calendar(api, user)
    job_id = await start_import(api, user, key, ics_with_events(2))
    assert (await api.client.delete(f"/calendars/{key}", headers=api.headers(user))).status_code == 204
    await api.drain()
    view = await job_view(api, user, job_id)
    assert view["status"] == "FAILURE" and "does not exist" in view["error"]
    assert await CalendarRepository(api.runtime.engine).count_events(key) == 0


# --- PATCH and DELETE /calendars/<key>/events/<uid> -------------------------------------------------------------


async def test_update_an_event_partially(api: Api, user: str) -> None:
    key = await new_calendar(api, user)
    event = await add_event(api, user, key, **GOOD_EVENT)
    path = f"/calendars/{key}/events/{event['uid']}"
    response = await api.client.patch(path, json={"summary": "Retro", "end": "2030-05-01T13:30:00+02:00"},
                                      headers=api.headers(user))
    assert response.status_code == 200, await response.get_data()
    body = await response.get_json()
    assert body == {**event, "summary": "Retro", "end": "2030-05-01T11:30:00+00:00"}
    cleared = await (await api.client.patch(path, json={"description": None}, headers=api.headers(user))).get_json()
    assert cleared["description"] is None and cleared["summary"] == "Retro"
    assert await events(api, user, key) == [cleared]


async def test_update_an_imported_event_whose_uid_has_a_slash(api: Api, user: str) -> None:
    """UIDs come from ICS files and may hold "/": the route takes them, percent-encoded or not."""
    key = await new_calendar(api, user)
    ics = ics_with_events(1).replace("UID:evt-0@test", "UID:team/evt 0@example.org")
    await start_import(api, user, key, ics)
    await api.drain()
    for uid in ("team/evt%200@example.org", "team%2Fevt%200@example.org"):
        path = f"/calendars/{key}/events/{uid}"
        response = await api.client.patch(path, json={"summary": "Renamed"}, headers=api.headers(user))
        assert response.status_code == 200, (path, await response.get_data())
        assert (await response.get_json())["uid"] == "team/evt 0@example.org"
    response = await api.client.delete(f"/calendars/{key}/events/team/evt%200@example.org", headers=api.headers(user))
    assert response.status_code == 204
    assert await events(api, user, key) == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({}, "at least one of"),
        ({"summary": None}, "summary cannot be null"),
        ({"start": None}, "start cannot be null"),
        ({"summary": ""}, "summary"),
        ({"uid": "other@test"}, "uid"),
        ({"start": "not a date"}, "start"),
        ({"start": "2030-05-01T10:00:00Z", "end": "2030-05-01T09:00:00Z"}, "end must not be before start"),
        ({"end": "2030-05-01T08:00:00Z"}, "end must not be before start"),
        ({"start": "2030-05-02T08:00:00Z"}, "end must not be before start"),
        ({"description": "x" * 10_001}, "description"),
        ({"summary": "a\nb"}, "summary"),
        (["summary"], "body"),
    ],
    ids=["empty", "null-summary", "null-start", "blank-summary", "uid-is-immutable", "bad-start", "end-before-start",
         "end-before-stored-start", "start-after-stored-end", "description-too-long", "newline-summary",
         "not-an-object"],
)
async def test_update_an_event_with_an_invalid_body_is_422(api: Api, user: str, body: Any, fragment: str) -> None:
    key = await new_calendar(api, user)
    event = await add_event(api, user, key, **GOOD_EVENT)
    response = await api.client.patch(f"/calendars/{key}/events/{event['uid']}", json=body, headers=api.headers(user))
    assert response.status_code == 422, await response.get_data()
    payload = await response.get_json()
    assert payload["error"] == "invalid_body" and fragment in payload["message"], payload
    assert await events(api, user, key) == [event], "nothing changed"


async def test_delete_an_event(api: Api, user: str) -> None:
    key = await new_calendar(api, user)
    gone = await add_event(api, user, key, **GOOD_EVENT)
    kept = await add_event(api, user, key, **{**GOOD_EVENT, "summary": "Kept"})
    response = await api.client.delete(f"/calendars/{key}/events/{gone['uid']}", headers=api.headers(user))
    assert response.status_code == 204 and await response.get_data() == b""
    assert await events(api, user, key) == [kept]
    again = await api.client.delete(f"/calendars/{key}/events/{gone['uid']}", headers=api.headers(user))
    assert again.status_code == 404
    assert (await again.get_json())["error"] == "event_not_found"


async def test_unknown_event_is_404(api: Api, user: str) -> None:
    key = await new_calendar(api, user)
    for uid in ("nope@test", "a%00b", "x" * 300):
        for method in ("PATCH", "DELETE"):
            body = {"summary": "x"} if method == "PATCH" else None
            response = await api.client.open(f"/calendars/{key}/events/{uid}", method=method, json=body,
                                             headers=api.headers(user))
            assert response.status_code == 404, (method, uid)
            assert (await response.get_json())["error"] == "event_not_found"


async def test_another_users_calendar_and_events_are_404(api: Api, user: str, other_user: str) -> None:
    """Rename, delete, event update and delete on another user's calendar: 404 calendar_not_found,
    revealing nothing and changing nothing (the answer the other calendar endpoints give)."""
    key = await new_calendar(api, user, "Private")
    event = await add_event(api, user, key, **GOOD_EVENT)
    headers = api.headers(other_user)
    for method, path, body in (
        ("PATCH", f"/calendars/{key}", {"name": "Mine now"}),
        ("DELETE", f"/calendars/{key}", None),
        ("PATCH", f"/calendars/{key}/events/{event['uid']}", {"summary": "Mine"}),
        ("DELETE", f"/calendars/{key}/events/{event['uid']}", None),
    ):
        response = await api.client.open(path, method=method, json=body, headers=headers)
        assert response.status_code == 404, (method, path)
        body = await response.get_data()
        assert (await response.get_json())["error"] == "calendar_not_found"
        assert b"Private" not in body and b"Stand-up" not in body
    assert [c["name"] for c in await calendars(api, user)] == ["Private"]
    assert await events(api, user, key) == [event]


async def test_the_new_endpoints_need_a_token(api: Api, user: str) -> None:
    key = await new_calendar(api, user)
    for method, path in (("PATCH", f"/calendars/{key}"), ("DELETE", f"/calendars/{key}"),
                         ("PATCH", f"/calendars/{key}/events/x"), ("DELETE", f"/calendars/{key}/events/x")):
        response = await api.client.open(path, method=method, json={"name": "x"})
        assert response.status_code == 401, (method, path)


async def test_the_new_endpoints_are_in_the_openapi_spec(api: Api) -> None:
    paths = (await (await api.client.get("/openapi.json")).get_json())["paths"]
    assert {"patch", "delete"} <= set(paths["/calendars/{key}"])
    assert {"patch", "delete"} <= set(paths["/calendars/{key}/events/{uid}"])
    assert "requestBody" in paths["/calendars/{key}/events/{uid}"]["patch"]
