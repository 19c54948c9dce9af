"""The /calendars endpoints: ownership and body validation."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.conftest import Api, ics_with_events
from tests.app.test_export_import import add_event, new_calendar

GOOD_EVENT = {"summary": "Stand-up", "start": "2030-05-01T09:00:00Z", "end": "2030-05-01T09:15:00Z"}


async def test_create_and_list_only_own_calendars(api: Api, user: str, other_user: str) -> None:
    """POST /calendars answers 201 with a key; GET /calendars lists the caller's calendars only."""
    mine = await new_calendar(api, user, "Mine")
    await new_calendar(api, other_user, "Theirs")
    body = await (await api.client.get("/calendars", headers=api.headers(user))).get_json()
    assert [(c["key"], c["name"]) for c in body["calendars"]] == [(mine, "Mine")]


async def test_event_is_stored_in_utc(api: Api, user: str) -> None:
    """Offsets are normalised to UTC and naive times read as UTC; sub-seconds are dropped."""
    key = await new_calendar(api, user)
    event = await add_event(api, user, key, summary="Call", start="2030-05-01T11:00:00.250+02:00",
                            end="2030-05-01T10:30:00")
    assert event["start"] == "2030-05-01T09:00:00+00:00" and event["end"] == "2030-05-01T10:30:00+00:00"
    listed = await (await api.client.get(f"/calendars/{key}/events", headers=api.headers(user))).get_json()
    assert listed["total"] == 1 and listed["events"][0]["uid"] == event["uid"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({**GOOD_EVENT, "start": "not a date"}, "start"),
        ({**GOOD_EVENT, "end": "2030-13-45T99:00:00Z"}, "end"),
        ({"start": GOOD_EVENT["start"], "end": GOOD_EVENT["end"]}, "summary"),
        ({"summary": "x", "start": GOOD_EVENT["start"]}, "end"),
        ({**GOOD_EVENT, "end": "2030-05-01T08:00:00Z"}, "end must not be before start"),
        ({**GOOD_EVENT, "summary": ""}, "summary"),
        ({**GOOD_EVENT, "colour": "red"}, "colour"),
        ([GOOD_EVENT], "body"),
    ],
    ids=["bad-start", "bad-end", "no-summary", "no-end", "end-before-start", "empty-summary", "unknown-field",
         "not-an-object"],
)
async def test_invalid_event_body_is_422(api: Api, user: str, body: Any, fragment: str) -> None:
    """Each invalid event body is a 422 whose message names the problem."""
    key = await new_calendar(api, user)
    response = await api.client.post(f"/calendars/{key}/events", json=body, headers=api.headers(user))
    assert response.status_code == 422
    payload = await response.get_json()
    assert payload["error"] == "invalid_body"
    assert fragment in payload["message"]


async def test_malformed_json_is_400_and_bad_calendar_body_422(api: Api, user: str) -> None:
    """Unparseable JSON is a 400; a JSON body of the wrong shape is a 422."""
    broken = await api.client.post(
        "/calendars", data=b"{not json", headers={**api.headers(user), "Content-Type": "application/json"}
    )
    assert broken.status_code == 400
    assert (await broken.get_json())["error"] == "bad_request"
    for body in ({}, {"name": ""}, {"name": 42}, {"name": "x" * 256}):
        response = await api.client.post("/calendars", json=body, headers=api.headers(user))
        assert response.status_code == 422, body


async def test_another_users_calendar_is_404(api: Api, user: str, other_user: str) -> None:
    """Events, export and import on another user's calendar answer 404 and reveal nothing."""
    key = await new_calendar(api, user, "Private")
    await add_event(api, user, key, **GOOD_EVENT)
    headers = api.headers(other_user)
    calls = [
        api.client.get(f"/calendars/{key}/events", headers=headers),
        api.client.post(f"/calendars/{key}/events", json=GOOD_EVENT, headers=headers),
        api.client.post(f"/calendars/{key}/export", headers=headers),
        api.client.post(f"/calendars/{key}/import", data=ics_with_events(1).encode(),
                        headers={**headers, "Content-Type": "text/calendar"}),
    ]
    for call in calls:
        response = await call
        assert response.status_code == 404
        body = await response.get_data()
        assert b"Private" not in body and b"Stand-up" not in body
    assert await api.runtime.client.list_for_user(other_user) == [], "no job was queued"


async def test_import_upload_errors(api: Api, user: str) -> None:
    """Empty upload and undecodable bytes are 422; an unsupported media type is 415."""
    key = await new_calendar(api, user)
    headers = {**api.headers(user), "Content-Type": "text/calendar"}
    empty = await api.client.post(f"/calendars/{key}/import", data=b"", headers=headers)
    assert empty.status_code == 422
    latin = await api.client.post(f"/calendars/{key}/import", data=b"\xff\xfe\xfa", headers=headers)
    assert latin.status_code == 422 and "charset" in (await latin.get_json())["message"]
    json_body = await api.client.post(f"/calendars/{key}/import", json={"ics": "x"}, headers=api.headers(user))
    assert json_body.status_code == 415
    assert await api.runtime.client.list_for_user(user) == []
