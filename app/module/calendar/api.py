"""The /calendars blueprint: calendars, events, and the export/import jobs."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, jsonify, request
from quart_schema import document_response, tag, validate_querystring, validate_request

from app.api.context import current_principal, runtime
from app.api.schemas import (
    CalendarCreate,
    CalendarCreated,
    CalendarList,
    CalendarOut,
    CalendarPatch,
    ErrorOut,
    EventCreate,
    EventList,
    EventOut,
    EventPatch,
    JobAccepted,
    Page,
)
from app.module.calendar.model import Calendar, Event
from app.module.calendar.repository import CalendarRepository
from app.module.calendar.service import ModuleCalendar, new_event_uid
from app.module.calendar.uploads import read_upload

__all__ = ["blueprint"]

blueprint = Blueprint("calendars", __name__, url_prefix="/calendars")


def _module() -> ModuleCalendar:
    rt = runtime()
    return ModuleCalendar(CalendarRepository(rt.engine), rt.client)


def _calendar_json(calendar: Calendar) -> dict[str, Any]:
    return {"key": calendar.key, "name": calendar.name, "created_at": calendar.created_at.isoformat()}


def _event_json(event: Event) -> dict[str, Any]:
    return {
        "uid": event.uid,
        "summary": event.summary,
        "start": event.start.isoformat(),
        "end": event.end.isoformat(),
        "description": event.description,
    }


def _status(body: Response, status: int) -> Response:
    body.status_code = status
    return body


def _no_content() -> Response:
    return Response(status=204)


@blueprint.post("")
@tag(["calendars"])
@validate_request(CalendarCreate)
@document_response(CalendarCreated, 201)
@document_response(ErrorOut, 422)
async def create_calendar(data: CalendarCreate) -> Response:
    """Create a calendar owned by the caller."""
    calendar = await _module().create(current_principal().uid, data.name)
    return _status(jsonify({"key": calendar.key}), 201)


@blueprint.get("")
@tag(["calendars"])
@document_response(CalendarList)
async def list_calendars() -> Response:
    """The caller's calendars (never another user's)."""
    calendars = await _module().calendars(current_principal().uid)
    return jsonify({"calendars": [_calendar_json(c) for c in calendars]})


@blueprint.patch("/<key>")
@tag(["calendars"])
@validate_request(CalendarPatch)
@document_response(CalendarOut)
@document_response(ErrorOut, 400)
@document_response(ErrorOut, 404)
@document_response(ErrorOut, 422)
async def rename_calendar(key: str, data: CalendarPatch) -> Response:
    """Rename the caller's calendar; answers the calendar."""
    calendar = await _module().rename(key, current_principal().uid, data.name)
    return jsonify(_calendar_json(calendar))


@blueprint.delete("/<key>")
@tag(["calendars"])
@document_response(ErrorOut, 404)
async def delete_calendar(key: str) -> Response:
    """Delete the caller's calendar and all its events; 204 without a body."""
    await _module().delete(key, current_principal().uid)
    return _no_content()


@blueprint.post("/<key>/events")
@tag(["calendars"])
@validate_request(EventCreate)
@document_response(EventOut, 201)
@document_response(ErrorOut, 404)
@document_response(ErrorOut, 422)
async def add_event(key: str, data: EventCreate) -> Response:
    """Add an event (ISO 8601 times; naive ones are UTC)."""
    event = Event(
        uid=new_event_uid(), summary=data.summary, start=data.start, end=data.end, description=data.description
    )
    await _module().add_event(key, current_principal().uid, event)
    return _status(jsonify(_event_json(event)), 201)


# `path:` so that a UID holding "/" (imported UIDs may) can be addressed, percent-encoded or not.
# `string:` spelled out: quart-schema's rule-to-OpenAPI regex otherwise swallows "<key>/events/<path:"
# and documents the route as /calendars/{uid}.
@blueprint.patch("/<string:key>/events/<path:uid>")
@tag(["calendars"])
@validate_request(EventPatch)
@document_response(EventOut)
@document_response(ErrorOut, 400)
@document_response(ErrorOut, 404)
@document_response(ErrorOut, 422)
async def update_event(key: str, uid: str, data: EventPatch) -> Response:
    """Change any of an event's summary, start, end and description; answers the event."""
    changes = {name: getattr(data, name) for name in data.model_fields_set}
    event = await _module().update_event(key, current_principal().uid, uid, changes)
    return jsonify(_event_json(event))


@blueprint.delete("/<string:key>/events/<path:uid>")
@tag(["calendars"])
@document_response(ErrorOut, 404)
async def delete_event(key: str, uid: str) -> Response:
    """Delete one event of the caller's calendar; 204 without a body."""
    await _module().delete_event(key, current_principal().uid, uid)
    return _no_content()


@blueprint.get("/<key>/events")
@tag(["calendars"])
@validate_querystring(Page)
@document_response(EventList)
@document_response(ErrorOut, 404)
async def list_events(key: str, query_args: Page) -> Response:
    """The calendar's events, by start time."""
    events, total = await _module().events(
        key, current_principal().uid, offset=query_args.offset, limit=query_args.limit
    )
    return jsonify(
        {"events": [_event_json(e) for e in events], "total": total,
         "offset": query_args.offset, "limit": query_args.limit}
    )


@blueprint.post("/<key>/export")
@tag(["calendars"])
@document_response(JobAccepted, 202)
@document_response(ErrorOut, 404)
@document_response(ErrorOut, 409)
async def export_calendar(key: str) -> Response:
    """Start the ICS export job; fetch the file from GET /jobs/<job_id>/result once it is SUCCESS."""
    job_id = await _module().export(key, current_principal().uid)
    return _status(jsonify({"job_id": job_id}), 202)


@blueprint.post("/<key>/import")
@tag(["calendars"])
@document_response(JobAccepted, 202)
@document_response(ErrorOut, 404)
@document_response(ErrorOut, 413)
async def import_calendar(key: str) -> Response:
    """Start an ICS import: body `text/calendar`, or multipart/form-data with a `file` part."""
    text = await read_upload(request)
    job_id = await _module().import_text(key, current_principal().uid, text)
    return _status(jsonify({"job_id": job_id}), 202)
