"""ICS codec: events to a valid iCalendar file and back, with the `icalendar` library."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import icalendar

from app.module.calendar.model import Calendar, Event
from app.module.calendar.tables import DESCRIPTION_CHARS, SUMMARY_CHARS, UID_CHARS
from app.text import sanitize_for_export, text_problem

__all__ = ["ICS_CONTENT_TYPE", "InvalidIcsError", "build_ics", "parse_ics"]

ICS_CONTENT_TYPE = "text/calendar; charset=utf-8"
_PRODID = "-//agent-async//reference calendar//EN"


class InvalidIcsError(ValueError):
    """The uploaded file is not a usable iCalendar file; permanent, so the import job is not retried."""


# Line breaks and tabs, which an imported SUMMARY may carry (escaped as \n in ICS) and a calendar
# name stored before the API refused them may hold: both are one line here.
_LINE_BREAKS = re.compile("[\t\r\n\u2028\u2029]+")


def _one_line(value: str) -> str:
    return _LINE_BREAKS.sub(" ", value).strip()


def build_ics(calendar: Calendar, events: Sequence[Event], *, now: datetime | None = None) -> bytes:
    """A VCALENDAR with one VEVENT per event (UTC times), as UTF-8 bytes.

    Texts stored before the API refused control characters still export: NUL and the other controls
    are dropped from every value. SUMMARY, DESCRIPTION and UID are TEXT values that icalendar escapes
    (line breaks become \n); X-WR-CALNAME is a property it does not know and writes as it is, so
    there a line break, which used to fail every export of the calendar, becomes a space.
    """
    stamp = (now or datetime.now(UTC)).replace(microsecond=0)
    cal = icalendar.Calendar()
    cal.add("prodid", _PRODID)
    cal.add("version", "2.0")
    cal.add("x-wr-calname", _one_line(sanitize_for_export(calendar.name)))
    for event in events:
        vevent = icalendar.Event()
        vevent.add("uid", sanitize_for_export(event.uid))
        vevent.add("dtstamp", stamp)
        vevent.add("dtstart", event.start)
        vevent.add("dtend", event.end)
        vevent.add("summary", sanitize_for_export(event.summary))
        if event.description:
            vevent.add("description", sanitize_for_export(event.description))
        cal.add_component(vevent)
    return bytes(cal.to_ical())


def parse_ics(text: str) -> list[Event]:
    """The VEVENTs of an ICS text; InvalidIcsError naming the first problem."""
    try:
        cal = icalendar.Calendar.from_ical(text)
    except ValueError as exc:
        raise InvalidIcsError(f"not an iCalendar file: {exc}") from None
    if getattr(cal, "name", None) != "VCALENDAR":
        raise InvalidIcsError("not an iCalendar file: the top-level component must be VCALENDAR")
    return [_event(number, vevent) for number, vevent in enumerate(cal.walk("VEVENT"), start=1)]


def _event(number: int, vevent: Any) -> Event:
    where = f"event #{number}"
    if vevent.errors:
        name, message = vevent.errors[0]
        raise InvalidIcsError(f"{where}: invalid {name}: {message}")
    if "DTSTART" not in vevent:
        raise InvalidIcsError(f"{where}: DTSTART is missing")
    start_value = vevent.decoded("DTSTART")
    start = _utc(start_value, where)
    try:
        if "DTEND" in vevent:
            end = _utc(vevent.decoded("DTEND"), where)
        elif "DURATION" in vevent:
            end = start + vevent.decoded("DURATION")
        else:
            # RFC 5545 3.6.1: an all-day event without an end lasts one day, a timed one has no length.
            end = start + (timedelta(days=1) if not isinstance(start_value, datetime) else timedelta(0))
    except OverflowError:
        raise InvalidIcsError(f"{where}: ends after year 9999") from None
    if end < start:
        raise InvalidIcsError(f"{where}: ends before it starts")
    # What is stored follows the API's rules (app/text.py), so every backend stores it alike: the
    # summary is one line (ICS line breaks become spaces), the description may have line breaks,
    # neither may hold NUL or another control character. Over-long texts are cut, as the API's
    # limits would refuse them.
    summary = _one_line(str(vevent.get("SUMMARY", "")))[:SUMMARY_CHARS]
    _check_text(summary, "SUMMARY", where, multiline=False)
    description = str(vevent["DESCRIPTION"])[:DESCRIPTION_CHARS] if "DESCRIPTION" in vevent else None
    if description is not None:
        _check_text(description, "DESCRIPTION", where, multiline=True)
    uid = str(vevent.get("UID", "")).strip() or _derived_uid(summary, start, end, description)
    _check_text(uid, "UID", where, multiline=False)
    if len(uid) > UID_CHARS:
        raise InvalidIcsError(f"{where}: UID is longer than {UID_CHARS} characters")
    return Event(uid=uid, summary=summary, start=start, end=end, description=description)


def _check_text(value: str, name: str, where: str, *, multiline: bool) -> None:
    problem = text_problem(value, multiline=multiline)
    if problem is not None:
        raise InvalidIcsError(f"{where}: {name} {problem}")


def _utc(value: object, where: str) -> datetime:
    if isinstance(value, datetime):
        # A floating time (no TZID) is read as UTC: the server has no better guess.
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        try:
            return aware.astimezone(UTC).replace(microsecond=0)
        except OverflowError:
            raise InvalidIcsError(f"{where}: a time is outside years 1-9999 in UTC") from None
    if isinstance(value, date):
        return datetime.combine(value, time(0), tzinfo=UTC)
    raise InvalidIcsError(f"{where}: a date or date-time was expected, got {value!r}")


def _derived_uid(summary: str, start: datetime, end: datetime, description: str | None) -> str:
    # A UID-less event gets one from its content, so importing the same file twice still skips it.
    digest = hashlib.sha256(f"{summary}\x00{start.isoformat()}\x00{end.isoformat()}\x00{description}".encode())
    return f"{digest.hexdigest()[:32]}@derived.agent-async"
