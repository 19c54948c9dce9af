"""The /calendars blueprint: calendars, events, the export/import jobs, external (ICS subscription) calendars."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, jsonify, request
from quart.blueprints import BlueprintSetupState
from quart_schema import document_response, tag, validate_headers, validate_querystring, validate_request
from werkzeug.routing import BaseConverter

from agent_async import EnqueuedOnce
from app.api.context import current_principal, runtime
from app.api.openapi import document_errors, document_plain_response, document_request_body
from app.api.schemas import (
    CalendarCreate,
    CalendarCreated,
    CalendarList,
    CalendarOut,
    CalendarPatch,
    EventCreate,
    EventList,
    EventOut,
    EventPatch,
    IdempotencyHeaders,
    JobAccepted,
    Page,
)
from app.errors import ApiError
from app.module.calendar.external_schemas import (
    ExternalCalendarCreate,
    ExternalCalendarOut,
    ExternalCalendarPatch,
    SyncQuery,
)
from app.module.calendar.fetch import FetchPolicy
from app.module.calendar.model import Calendar, Event, ExternalSource
from app.module.calendar.repository import CalendarRepository
from app.module.calendar.service import ModuleCalendar, enqueue_keyed, new_event_uid
from app.module.calendar.sweep_requests import JobRequestSyncExternalAuto
from app.module.calendar.uploads import FILE_FIELD, RAW_TYPES, read_upload

__all__ = ["blueprint"]

blueprint = Blueprint("calendars", __name__, url_prefix="/calendars")


class CalendarKeyConverter(BaseConverter):
    """A calendar key in `/calendars/<key>`: any one segment but "external", which is the collection of
    external calendars (POST only), so that PATCH or DELETE /calendars/external is a 405, not a 404."""

    regex = r"(?!external$)[^/]+"


@blueprint.record_once
def _register_converter(state: BlueprintSetupState) -> None:
    # Runs before the routes below are added to the app's map (deferred functions run in order).
    state.app.url_map.converters.setdefault("calendar_key", CalendarKeyConverter)


# What a 404 or 422 means on these operations (the defaults are in app.api.openapi).
_CALENDAR = {404: "`calendar_not_found`: no such calendar of the caller's (another user's is not shown)."}
_EVENT = {404: "`calendar_not_found`, or `event_not_found`: no such event in the calendar."}
_BODY = {422: "`invalid_body`: the body fails validation (the message names the field), or is not sent as "
              "`application/json`."}
_EVENT_BODY = {422: _BODY[422] + " Also when the event would end before it starts."}
_IN_FLIGHT = "`job_concurrent_limit`: an export or import of this user is already in flight."
_DELETED = "Deleted; no body."
_EXTERNAL = {404: "`calendar_not_found`: no such calendar of the caller's (another user's is not shown); "
                  "`subscription_not_found`: the calendar is not an external calendar."}
_SYNC_IN_FLIGHT = "`job_concurrent_limit`: a sync of this user is already in flight."
_KEYED = ("`invalid_body`: the `Idempotency-Key` header is not 1 to 255 visible ASCII characters; "
          "`idempotency_key_reused`: the key names a job another request made (another payload or file).")


def _module() -> ModuleCalendar:
    rt = runtime()
    return ModuleCalendar(CalendarRepository(rt.engine), rt.client, FetchPolicy.from_settings(rt.settings))


def _calendar_json(calendar: Calendar) -> dict[str, Any]:
    return {"key": calendar.key, "name": calendar.name, "created_at": calendar.created_at.isoformat()}


def _external_json(calendar: Calendar, source: ExternalSource) -> dict[str, Any]:
    return {
        **_calendar_json(calendar),
        "url": source.url,
        "sync_interval_minutes": source.sync_interval_minutes,
        "last_sync_at": None if source.last_sync_at is None else source.last_sync_at.isoformat(),
        "last_status": source.last_status,
        "last_error": source.last_error,
    }


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


def _accepted(enqueued: EnqueuedOnce) -> Response:
    """202 with the job's id; a repeat under an Idempotency-Key says it is one (the job is the first's)."""
    response = _status(jsonify({"job_id": enqueued.job_id}), 202)
    if enqueued.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


def _no_content() -> Response:
    response = Response(status=204)
    del response.headers["Content-Type"]  # no body, so no media type (Quart would say text/html)
    return response


@blueprint.post("")
@tag(["calendars"])
@validate_request(CalendarCreate)
@document_response(CalendarCreated, 201)
@document_errors(400, 408, 413, 422, 503, descriptions=_BODY)
async def create_calendar(data: CalendarCreate) -> Response:
    """Create a calendar owned by the caller."""
    calendar = await _module().create(current_principal().uid, data.name)
    return _status(jsonify({"key": calendar.key}), 201)


@blueprint.get("")
@tag(["calendars"])
@document_response(CalendarList)
@document_errors(503)
async def list_calendars() -> Response:
    """The caller's calendars (never another user's)."""
    calendars = await _module().calendars(current_principal().uid)
    return jsonify({"calendars": [_calendar_json(c) for c in calendars]})


@blueprint.patch("/<calendar_key:key>")
@tag(["calendars"])
@validate_request(CalendarPatch)
@document_response(CalendarOut)
@document_errors(400, 404, 408, 413, 422, 503, descriptions={**_CALENDAR, **_BODY})
async def rename_calendar(key: str, data: CalendarPatch) -> Response:
    """Rename the caller's calendar; answers the calendar."""
    calendar = await _module().rename(key, current_principal().uid, data.name)
    return jsonify(_calendar_json(calendar))


@blueprint.delete("/<calendar_key:key>")
@tag(["calendars"])
@document_plain_response(204, _DELETED)
@document_errors(404, 503, descriptions=_CALENDAR)
async def delete_calendar(key: str) -> Response:
    """Delete the caller's calendar and all its events (an external calendar: its subscription too); 204."""
    await _module().delete(key, current_principal().uid)
    return _no_content()


@blueprint.post("/<key>/events")
@tag(["calendars"])
@validate_request(EventCreate)
@document_response(EventOut, 201)
@document_errors(400, 404, 408, 413, 422, 503, descriptions={**_CALENDAR, **_EVENT_BODY})
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
@document_errors(400, 404, 408, 413, 422, 503, descriptions={**_EVENT, **_EVENT_BODY})
async def update_event(key: str, uid: str, data: EventPatch) -> Response:
    """Change any of an event's summary, start, end and description; answers the event."""
    changes = {name: getattr(data, name) for name in data.model_fields_set}
    event = await _module().update_event(key, current_principal().uid, uid, changes)
    return jsonify(_event_json(event))


@blueprint.delete("/<string:key>/events/<path:uid>")
@tag(["calendars"])
@document_plain_response(204, _DELETED)
@document_errors(404, 503, descriptions=_EVENT)
async def delete_event(key: str, uid: str) -> Response:
    """Delete one event of the caller's calendar; 204 without a body."""
    await _module().delete_event(key, current_principal().uid, uid)
    return _no_content()


@blueprint.get("/<key>/events")
@tag(["calendars"])
@validate_querystring(Page)
@document_response(EventList)
@document_errors(
    404, 422, 503,
    descriptions={**_CALENDAR, 422: "`invalid_body`: `offset` or `limit` out of range or not an integer."},
)
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
@validate_headers(IdempotencyHeaders)
@document_response(JobAccepted, 202)
@document_errors(404, 409, 422, 503, descriptions={**_CALENDAR, 409: _IN_FLIGHT, 422: _KEYED})
async def export_calendar(key: str, headers: IdempotencyHeaders) -> Response:
    """Start the ICS export job; fetch the file from GET /jobs/<job_id>/result once it is SUCCESS."""
    return _accepted(await _module().export(key, current_principal().uid, idempotency_key=headers.idempotency_key))


@blueprint.post("/<key>/import")
@tag(["calendars"])
@validate_headers(IdempotencyHeaders)
@document_request_body(
    "The ICS file (RFC 5545), either as the whole body or as the `file` part of a multipart form. The charset "
    "is the `charset` parameter of the body's (or the part's) Content-Type, UTF-8 by default.",
    content={
        # Text in the declared charset (application/octet-stream too: it is decoded the same way).
        **{media_type: {"schema": {"type": "string", "minLength": 1}} for media_type in sorted(RAW_TYPES)},
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": [FILE_FIELD],
                "properties": {FILE_FIELD: {"type": "string", "format": "binary"}},
            },
        },
    },
)
@document_response(JobAccepted, 202)
@document_errors(
    404, 408, 409, 413, 415, 422, 503,
    descriptions={
        **_CALENDAR,
        409: _IN_FLIGHT,
        415: "`unsupported_media_type`: the body is neither " + ", ".join(f"`{t}`" for t in sorted(RAW_TYPES))
             + " nor `multipart/form-data`.",
        422: f"`invalid_body`: the file is empty, not decodable in its charset, holds a NUL, or the multipart "
             f"body has no `{FILE_FIELD}` part. " + _KEYED,
    },
)
async def import_calendar(key: str, headers: IdempotencyHeaders) -> Response:
    """Start an ICS import: body `text/calendar`, or multipart/form-data with a `file` part."""
    text = await read_upload(request)
    enqueued = await _module().import_text(key, current_principal().uid, text, idempotency_key=headers.idempotency_key)
    return _accepted(enqueued)


# --- external calendars (ICS subscriptions) ------------------------------------------------------------------


@blueprint.post("/external")
@tag(["calendars"])
@validate_request(ExternalCalendarCreate)
@document_response(ExternalCalendarOut, 201)
@document_errors(
    400, 408, 413, 422, 503,
    descriptions={422: _BODY[422] + " `url_refused`: the URL may not be fetched; the message says why "
                        "(not http/https, credentials in it, its host does not resolve, or resolves to a "
                        "loopback, private, link-local, multicast, reserved or unspecified address)."},
)
async def subscribe_external(data: ExternalCalendarCreate) -> Response:
    """Subscribe to an ICS URL: a new calendar of the caller's, filled by `POST /calendars/<key>/sync` and
    the periodic sync. The URL is checked now and again at every fetch and redirect."""
    calendar, source = await _module().subscribe(
        current_principal().uid, data.name, data.url, data.sync_interval_minutes
    )
    return _status(jsonify(_external_json(calendar, source)), 201)


@blueprint.get("/<key>/external")
@tag(["calendars"])
@document_response(ExternalCalendarOut)
@document_errors(404, 503, descriptions=_EXTERNAL)
async def get_external(key: str) -> Response:
    """The external calendar's source and how its last sync went."""
    calendar, source = await _module().external(key, current_principal().uid)
    return jsonify(_external_json(calendar, source))


@blueprint.patch("/<key>/external")
@tag(["calendars"])
@validate_request(ExternalCalendarPatch)
@document_response(ExternalCalendarOut)
@document_errors(400, 404, 408, 413, 422, 503, descriptions={**_EXTERNAL, **_BODY})
async def patch_external(key: str, data: ExternalCalendarPatch) -> Response:
    """Change the sync interval (minutes, 5 to 10080); answers the external calendar."""
    calendar, source = await _module().set_sync_interval(key, current_principal().uid, data.sync_interval_minutes)
    return jsonify(_external_json(calendar, source))


@blueprint.post("/<key>/sync")
@tag(["calendars"])
@validate_querystring(SyncQuery)
@validate_headers(IdempotencyHeaders)
@document_response(JobAccepted, 202)
@document_errors(
    404, 409, 422, 503,
    descriptions={**_EXTERNAL, 409: _SYNC_IN_FLIGHT, 422: "`invalid_body`: `force` is not a boolean. " + _KEYED},
)
async def sync_external(key: str, query_args: SyncQuery, headers: IdempotencyHeaders) -> Response:
    """Queue a sync of the external calendar now (`?force=true`: a full download, ignoring the ETag)."""
    enqueued = await _module().sync(
        key, current_principal().uid, force=query_args.force, idempotency_key=headers.idempotency_key
    )
    return _accepted(enqueued)


# POST /admin/sync/external lives with the module whose job it starts (the admin module knows no
# calendars); the app registers this blueprint beside the /admin one.
admin_blueprint = Blueprint("calendar_admin", __name__, url_prefix="/admin")


@admin_blueprint.post("/sync/external")
@tag(["admin"])
@validate_headers(IdempotencyHeaders)
@document_response(JobAccepted, 202)
@document_errors(
    403, 409, 422, 503,
    descriptions={
        403: "`forbidden`: the token is not an admin token.",
        409: "`job_concurrent_limit`: a sweep job is queued or running already.",
        422: _KEYED,
    },
)
async def sweep_external(headers: IdempotencyHeaders) -> Response:
    """Start a sweep of every due external calendar now (the periodic sync's job), as the admin asking.

    Its run record (`GET /admin/runs?kind=calendar.sync.external`) is `manual`, with the admin's uid;
    it is `skipped` if the previous sweep's group is still running."""
    principal = current_principal()
    if not principal.admin:
        raise ApiError(403, "forbidden", "an admin token is required")
    sweep = JobRequestSyncExternalAuto(requested_by=principal.uid)
    return _accepted(await enqueue_keyed(runtime().client, sweep, None, headers.idempotency_key))
