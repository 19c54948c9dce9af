"""No client input answers a 500: unreadable JSON, text the databases refuse, odd times, oversized
heads, tokens from the future; and every error code the API emits is in docs/api.md."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import pytest
from itsdangerous import TimestampSigner
from sqlalchemy.exc import OperationalError

from agent_async import JobStatus, RequestCode
from app.api.request import MAX_REQUEST_HEAD_BYTES
from app.auth import CLOCK_SKEW_S, TokenSigner
from app.module.admin.requests import JobRequestCleanupLargeStore
from app.module.calendar.model import Event
from app.module.calendar.repository import (
    CalendarRepository,
    CalendarStorageError,
    CalendarStorageUnavailableError,
    storage_errors,
)
from app.module.calendar.requests import JobRequestImportIcs
from tests.app.conftest import ROOT, SECRET, Api
from tests.app.test_export_import import add_event, job_view, new_calendar

GOOD_EVENT = {"summary": "Stand-up", "start": "2030-05-01T09:00:00Z", "end": "2030-05-01T09:15:00Z"}
CLEANUP = JobRequestCleanupLargeStore.name


def is_postgresql(api: Api) -> bool:
    return api.runtime.settings.agent.database_url.startswith("postgresql")


async def json_endpoints(api: Api, user: str) -> list[tuple[str, str, dict[str, str]]]:
    """(method, path, headers) of every endpoint that reads a JSON body."""
    key = await new_calendar(api, user)
    uid = (await add_event(api, user, key, **GOOD_EVENT))["uid"]
    return [
        ("POST", "/calendars", api.headers(user)),
        ("PATCH", f"/calendars/{key}", api.headers(user)),
        ("POST", f"/calendars/{key}/events", api.headers(user)),
        ("PATCH", f"/calendars/{key}/events/{uid}", api.headers(user)),
        ("PATCH", f"/admin/schedules/{CLEANUP}", api.headers("root", admin=True)),
    ]


# --- 1. JSON bodies that cannot be read: 400 bad_request, never 500 ---------------------------------------


@pytest.mark.parametrize(
    ("content_type", "body", "fragment"),
    [
        ("application/json", b'{"name": "caf\xe9"}', "not valid UTF-8"),
        ("application/json; charset=latin-1", '{"name": "café"}'.encode("latin-1"), "UTF-8"),
        ("application/json; charset=iso-8859-1", '{"name": "café"}'.encode(), "UTF-8"),
        ("application/json", b"[" * 100_000, "nested too deeply"),
        ("application/json", b'{"name": ' + b"1" * 5000 + b"}", "number"),
        ("application/json", b"{not json", "not parseable JSON"),
    ],
    ids=["invalid-utf8", "latin1-declared", "other-charset-declared", "deeply-nested", "huge-number", "malformed"],
)
async def test_unreadable_json_is_400_on_every_json_endpoint(
    api: Api, user: str, content_type: str, body: bytes, fragment: str
) -> None:
    for method, path, headers in await json_endpoints(api, user):
        response = await api.client.open(path, method=method, data=body,
                                         headers={**headers, "Content-Type": content_type})
        assert response.status_code == 400, (method, path, await response.get_data())
        payload = await response.get_json()
        assert payload["error"] == "bad_request", (method, path)
        assert fragment in payload["message"], (method, path, payload)


async def test_json_declared_in_another_charset_is_read_when_it_is_ascii(api: Api, user: str) -> None:
    """ASCII reads the same in every charset: such a body is accepted, and so is a UTF-8 BOM."""
    headers = api.headers(user)
    ascii_body = await api.client.post("/calendars", data=b'{"name": "plain"}',
                                       headers={**headers, "Content-Type": "application/json; charset=latin-1"})
    assert ascii_body.status_code == 201, await ascii_body.get_data()
    bom = await api.client.post("/calendars", data='\ufeff{"name": "café"}'.encode(),
                                headers={**headers, "Content-Type": "application/json; charset=utf-8"})
    assert bom.status_code == 201, await bom.get_data()
    names = [c["name"] for c in (await (await api.client.get("/calendars", headers=headers)).get_json())["calendars"]]
    assert sorted(names) == ["café", "plain"]


# --- 2. Text the databases refuse, or that is never meaningful: 422, the same on every backend -------------

SINGLE_LINE_REFUSED = ["a\x00b", "a\nb", "a\rb", "a\tb", "a\x1bb", "a\x7fb", "a\x85b", "a\u2028b"]
MULTI_LINE_REFUSED = ["a\x00b", "a\x01b", "a\x0bb", "a\x0cb", "a\x7fb"]


@pytest.mark.parametrize("value", SINGLE_LINE_REFUSED, ids=[repr(v) for v in SINGLE_LINE_REFUSED])
async def test_control_characters_in_a_name_or_summary_are_422(api: Api, user: str, value: str) -> None:
    key = await new_calendar(api, user)
    uid = (await add_event(api, user, key, **GOOD_EVENT))["uid"]
    headers = api.headers(user)
    for method, path, body, field in (
        ("POST", "/calendars", {"name": value}, "name"),
        ("PATCH", f"/calendars/{key}", {"name": value}, "name"),
        ("POST", f"/calendars/{key}/events", {**GOOD_EVENT, "summary": value}, "summary"),
        ("PATCH", f"/calendars/{key}/events/{uid}", {"summary": value}, "summary"),
    ):
        response = await api.client.open(path, method=method, json=body, headers=headers)
        assert response.status_code == 422, (method, path, await response.get_data())
        payload = await response.get_json()
        assert payload["error"] == "invalid_body"
        assert payload["message"].startswith(f"{field}: ") and "control characters" in payload["message"]
        assert f"U+{ord(value[1]):04X}" in payload["message"], payload
    calendars = (await (await api.client.get("/calendars", headers=headers)).get_json())["calendars"]
    assert [c["name"] for c in calendars] == ["Work"], "nothing was stored or renamed"


@pytest.mark.parametrize("value", MULTI_LINE_REFUSED, ids=[repr(v) for v in MULTI_LINE_REFUSED])
async def test_control_characters_in_a_description_are_422(api: Api, user: str, value: str) -> None:
    key = await new_calendar(api, user)
    response = await api.client.post(f"/calendars/{key}/events", json={**GOOD_EVENT, "description": value},
                                     headers=api.headers(user))
    assert response.status_code == 422
    assert (await response.get_json())["message"].startswith("description: ")


async def test_a_description_keeps_tabs_and_line_breaks(api: Api, user: str) -> None:
    """A description is multi-line text: tab, LF and CRLF are stored and returned as sent."""
    key = await new_calendar(api, user)
    text = "Agenda:\r\n\t1. intro\n\t2. demo"
    event = await add_event(api, user, key, **GOOD_EVENT, description=text)
    assert event["description"] == text
    listed = await (await api.client.get(f"/calendars/{key}/events", headers=api.headers(user))).get_json()
    assert listed["events"][0]["description"] == text


async def test_a_lone_surrogate_is_422(api: Api, user: str) -> None:
    """A JSON escape can produce a lone surrogate, which no database can encode."""
    response = await api.client.post("/calendars", data=b'{"name": "a\\ud800"}',
                                     headers={**api.headers(user), "Content-Type": "application/json"})
    assert response.status_code == 422


async def test_a_nul_in_the_calendar_key_is_404(api: Api, user: str) -> None:
    """A key that cannot be a calendar key is not found without a query (PostgreSQL failed on NUL)."""
    await new_calendar(api, user)
    for method, path in (("GET", "/calendars/a%00b/events"), ("POST", "/calendars/a%00b/export"),
                         ("PATCH", "/calendars/a%00b"), ("DELETE", "/calendars/a%00b")):
        body = {"name": "x"} if method == "PATCH" else None
        response = await api.client.open(path, method=method, json=body, headers=api.headers(user))
        assert response.status_code == 404, (method, path, await response.get_data())
        assert (await response.get_json())["error"] == "calendar_not_found"


async def test_a_time_whose_utc_value_is_past_year_9999_is_422(api: Api, user: str) -> None:
    key = await new_calendar(api, user)
    late = "9999-12-31T23:00:00-05:00"
    response = await api.client.post(f"/calendars/{key}/events", json={**GOOD_EVENT, "start": late, "end": late},
                                     headers=api.headers(user))
    assert response.status_code == 422
    assert "outside years 1-9999" in (await response.get_json())["message"]


async def test_an_upload_with_a_nul_is_422(api: Api, user: str) -> None:
    key = await new_calendar(api, user)
    ics = "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\nUID:a@test\r\nSUMMARY:a\x00b\r\n" \
          "DTSTART:20300101T090000Z\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n"
    response = await api.client.post(f"/calendars/{key}/import", data=ics.encode(),
                                     headers={**api.headers(user), "Content-Type": "text/calendar"})
    assert response.status_code == 422
    assert (await response.get_json())["message"] == "the uploaded file contains a NUL character (line 5)"
    assert await api.runtime.client.list_for_user(user) == []


def ics_event(**props: str) -> str:
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//tests//EN", "BEGIN:VEVENT",
             "DTSTART:20300101T090000Z", "DTEND:20300101T100000Z"]
    lines += [f"{name}:{value}" for name, value in props.items()]
    return "\r\n".join([*lines, "END:VEVENT", "END:VCALENDAR", ""])


async def import_without_the_api_check(api: Api, user: str, key: str, ics: str) -> str:
    """Enqueue an import of `ics` as the API would, minus the upload's own NUL check."""
    ref = await api.runtime.client.get_large_store().save_text(ics, "text/calendar")
    return await api.runtime.client.enqueue(JobRequestImportIcs(calendar_key=key, source_ref=ref), user)


@pytest.mark.parametrize(
    ("props", "error"),
    [
        ({"UID": "n@test", "SUMMARY": "a\x00b"}, "InvalidIcsError: event #1: SUMMARY must not contain control "
                                                 "characters or line breaks (found U+0000 NUL at position 1)"),
        ({"UID": "n\x00@test", "SUMMARY": "s"}, "InvalidIcsError: event #1: UID must not contain"),
        ({"UID": "d@test", "SUMMARY": "s", "DESCRIPTION": "x\x00y"}, "InvalidIcsError: event #1: DESCRIPTION "
                                                                    "must not contain control characters other"),
        ({"UID": "c@test", "SUMMARY": "s", "DESCRIPTION": "x\x01y"}, "InvalidIcsError: event #1: DESCRIPTION"),
    ],
    ids=["nul-summary", "nul-uid", "nul-description", "control-description"],
)
async def test_an_import_refuses_nul_and_controls_with_a_clear_error(
    api: Api, user: str, props: dict[str, str], error: str
) -> None:
    """The worker checks every value: the job fails at once naming event and property, the same on
    every backend, and never shows SQL (PostgreSQL used to fail the INSERT)."""
    key = await new_calendar(api, user)
    job_id = await import_without_the_api_check(api, user, key, ics_event(**props))
    await api.drain()
    view = await job_view(api, user, job_id)
    assert view["status"] == "FAILURE", view
    assert view["error"].startswith(error), view["error"]
    assert "SQL" not in view["error"] and "INSERT" not in view["error"]
    assert (await api.state(job_id)).attempts == 1
    assert await CalendarRepository(api.runtime.engine).count_events(key) == 0


async def test_an_import_stores_what_the_api_would_accept(api: Api, user: str) -> None:
    """An ICS summary's line breaks become spaces (a summary is one line); a description keeps its
    own and is cut at the API's limit, which every backend can store (MariaDB's TEXT is 64 KB)."""
    key = await new_calendar(api, user)
    long = "é" * 40_000
    job_id = await import_without_the_api_check(
        api, user, key, ics_event(UID="l@test", SUMMARY="two\\nlines\\n", DESCRIPTION=f"a\\nb\t{long}")
    )
    await api.drain()
    assert (await job_view(api, user, job_id))["status"] == "SUCCESS"
    [event] = await CalendarRepository(api.runtime.engine).list_events(key)
    assert event.summary == "two lines"
    assert event.description is not None and event.description.startswith("a\nb\té")
    assert len(event.description) == 10_000


async def test_a_storage_failure_in_an_import_shows_no_sql(
    api: Api, user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the value check out of the way, PostgreSQL refuses the NUL: the job's error is a plain
    CalendarStorageError, without the statement or the driver's message, and is not retried."""
    if not is_postgresql(api):
        pytest.skip("only PostgreSQL refuses a NUL in text")
    monkeypatch.setattr("app.module.calendar.ics.text_problem", lambda *args, **kwargs: None, raising=False)
    key = await new_calendar(api, user)
    job_id = await import_without_the_api_check(api, user, key, ics_event(UID="n@test", SUMMARY="a\x00b"))
    source_ref = (await api.state(job_id)).payload["source_ref"]
    await api.drain()
    state = await api.state(job_id)
    assert state.status is JobStatus.FAILURE and state.attempts == 1
    assert state.error == ("CalendarStorageError: the calendar could not be stored: the data contains text the "
                           "database refuses (NUL character)")
    assert await api.runtime.client.get_large_store().load(source_ref) is None, "a refused upload is dropped"


async def test_repository_errors_carry_no_sql(api: Api, user: str) -> None:
    """Outages become a retryable CalendarStorageUnavailableError (503 in the API), refusals a
    CalendarStorageError; neither message holds the statement."""
    translated = storage_errors("the events could not be read")
    with pytest.raises(CalendarStorageUnavailableError) as outage, translated:
        raise OperationalError("SELECT secret FROM t", {}, Exception("database is locked"))
    assert str(outage.value) == "the events could not be read: the database is unavailable; retry later"
    assert isinstance(outage.value.__cause__, OperationalError), "the cause stays for the log"
    if is_postgresql(api):
        key = await new_calendar(api, user)
        at = datetime(2030, 1, 1, tzinfo=UTC)
        event = Event(uid="x@test", summary="a\x00b", start=at, end=at)
        with pytest.raises(CalendarStorageError) as refused:
            await CalendarRepository(api.runtime.engine).upsert_events(key, [event])
        assert "SQL" not in str(refused.value) and "NUL character" in str(refused.value)


# --- 5. Tokens from the future ----------------------------------------------------------------------------------


def token_issued_at(issued_s: int, uid: str = "alice") -> str:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TimestampSigner, "get_timestamp", lambda self: issued_s)
        return TokenSigner(SECRET, max_age_s=60).issue(uid)


async def test_a_token_from_the_future_is_invalid_not_expired(api: Api) -> None:
    token = token_issued_at(int(time.time()) + 3600)
    response = await api.client.get("/jobs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    body = await response.get_json()
    assert body["error"] == "invalid_token"
    assert "in the future" in body["message"] and "expired" not in body["message"]


async def test_a_token_a_few_seconds_ahead_is_accepted(api: Api) -> None:
    """Clock skew between the issuing host and this one is allowed for CLOCK_SKEW_S seconds."""
    assert CLOCK_SKEW_S >= 2
    token = token_issued_at(int(time.time()) + 2)
    response = await api.client.get("/jobs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, await response.get_data()


def test_token_age_is_judged_with_the_signers_clock() -> None:
    from app.errors import ApiError

    now = [1_000_000.0]
    signer = TokenSigner(SECRET, max_age_s=60, clock=lambda: now[0])
    token = token_issued_at(1_000_000)
    now[0] = 1_000_000 - CLOCK_SKEW_S  # issued CLOCK_SKEW_S ahead: still fine
    assert signer.verify(token).uid == "alice"
    signer = TokenSigner(SECRET, max_age_s=60, clock=lambda: now[0])
    now[0] = 1_000_000 - CLOCK_SKEW_S - 2
    with pytest.raises(ApiError) as future:
        signer.verify(token)
    assert future.value.code == "invalid_token"
    now[0] = 1_000_000 + 61
    with pytest.raises(ApiError) as expired:
        signer.verify(token)
    assert expired.value.code == "token_expired"


# --- 6. Oversized request heads: a JSON 431 ---------------------------------------------------------------


async def test_an_oversized_header_or_url_is_a_json_431(api: Api, user: str) -> None:
    """Checked before authentication; hypercorn's own, higher limit is covered in test_cli.py."""
    big = "x" * MAX_REQUEST_HEAD_BYTES
    for response in (
        await api.client.get("/calendars", headers={**api.headers(user), "X-Padding": big}),
        await api.client.get(f"/calendars/{big}/events", headers=api.headers(user)),
        await api.client.get(f"/jobs?limit=5&pad={big}", headers=api.headers(user)),
        await api.client.get("/health", headers={"X-Padding": big}),
        await api.client.get("/jobs", headers={"Authorization": f"Bearer {big}"}),
    ):
        assert response.status_code == 431
        body = await response.get_json()
        assert body["error"] == "request_header_fields_too_large"
        assert str(MAX_REQUEST_HEAD_BYTES) in body["message"]
    fine = await api.client.get("/calendars", headers={**api.headers(user), "X-Padding": "x" * 4000})
    assert fine.status_code == 200


# --- 8. docs/api.md lists every error code --------------------------------------------------------------------


def emitted_error_codes() -> set[str]:
    codes: set[str] = set()
    for path in (ROOT / "app").rglob("*.py"):
        source = path.read_text()
        codes |= set(re.findall(r"(?:ApiError|error_response)\(\s*\d{3},\s*\"([a-z_]+)\"", source))
        if path.name == "errors.py":
            block = source[source.index("_HTTP_CODES"):]
            codes |= set(re.findall(r"\d{3}: \"([a-z_]+)\"", block[:block.index("}")]))
            codes |= set(re.findall(r"_HTTP_CODES\.get\(status, \"([a-z_]+)\"\)", source))  # the fallback
    codes |= {code.value for code in RequestCode}  # RequestRefusedError, rendered by errors.py
    return codes


def test_the_error_table_lists_every_code() -> None:
    docs = (ROOT / "docs" / "api.md").read_text()
    section = docs[docs.index("## Authentication"):docs.index("## Endpoints")]
    documented = set(re.findall(r"`([a-z_]+)`", section))
    emitted = emitted_error_codes()
    assert {"bad_request", "invalid_body", "schedule_not_found", "event_not_found",
            "request_header_fields_too_large", "internal_error"} <= emitted, "the scan finds the codes"
    assert emitted - documented == set()
