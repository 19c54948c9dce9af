"""The /jobs blueprint: the caller's jobs, their public view, their large result, cancellation."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, Response, jsonify
from quart_schema import document_response, tag, validate_headers, validate_querystring

from agent_async import ACTIVE, JobState, JobStatus
from agent_async.errors import StorageError
from agent_async.storage import BlobStream
from app.api.context import current_principal, runtime
from app.api.openapi import document_errors, document_plain_response
from app.api.schemas import JobList, JobPublic, Page, ResultQuery
from app.api.sse import SSE_CONTENT, SSE_HEADERS, SseHeaders, heartbeat_seconds, job_stream, sse_response
from app.errors import ApiError

__all__ = ["blueprint"]

logger = logging.getLogger(__name__)

blueprint = Blueprint("jobs", __name__, url_prefix="/jobs")

_MAX_JOB_ID_CHARS = 128

# The errors of every /jobs/<job_id> operation (owned_state).
_OWNED = {
    403: "`forbidden`: the job belongs to another user.",
    404: "`job_not_found`: no such job (or a system job, to a non-admin token).",
}


async def owned_state(job_id: str) -> JobState:
    """The caller's job; 404 if unknown or a system job, 403 if another user's.

    An admin may read any job, system jobs included (scheduled runs have no user).
    """
    state = None if len(job_id) > _MAX_JOB_ID_CHARS else await runtime().client.get_state(job_id)
    principal = current_principal()
    if state is not None and principal.admin:
        return state
    # System jobs answer like unknown ids, so this interface does not even reveal that they exist.
    if state is None or state.user_uid is None:
        raise ApiError(404, "job_not_found", f"no job {job_id}")
    if state.user_uid != principal.uid:
        raise ApiError(403, "forbidden", "this job belongs to another user")
    return state


@blueprint.get("")
@tag(["jobs"])
@validate_querystring(Page)
@document_response(JobList)
@document_errors(422, 503, descriptions={422: "`invalid_body`: `offset` or `limit` out of range or not an integer."})
async def list_jobs(query_args: Page) -> Response:
    """The caller's jobs, newest first."""
    rt = runtime()
    uid = current_principal().uid
    states = await rt.client.list_for_user(uid, offset=query_args.offset, limit=query_args.limit)
    total = await rt.client.count_for_user(uid)
    items = [{"job_id": s.job_id, "job": rt.serializer.dump(s)} for s in states]
    return jsonify({"jobs": items, "total": total, "offset": query_args.offset, "limit": query_args.limit})


@blueprint.get("/<job_id>")
@tag(["jobs"])
@document_response(JobPublic)
@document_errors(403, 404, 503, descriptions=_OWNED)
async def get_job(job_id: str) -> Response:
    """The job's public view: status, payload (redacted), result (without large_result), error."""
    return jsonify(runtime().serializer.dump(await owned_state(job_id)))


@blueprint.post("/<job_id>/cancel")
@tag(["jobs"])
@document_response(JobPublic)
@document_errors(403, 404, 503, descriptions=_OWNED)
async def cancel_job(job_id: str) -> Response:
    """Cancel the job (idempotent) and return its refreshed public view."""
    await owned_state(job_id)
    state = await runtime().client.cancel(job_id)
    if state is None:
        raise ApiError(404, "job_not_found", f"no job {job_id}")
    return jsonify(runtime().serializer.dump(state))


@blueprint.get("/<job_id>/events")
@tag(["jobs"])
@validate_headers(SseHeaders)
@document_plain_response(
    200,
    "The job's events as Server-Sent Events, from its creation (or after `Last-Event-ID`) to its terminal "
    "event, after which the stream ends. Each `data` is a JobEventOut; `: keep-alive` comments while idle.",
    content=SSE_CONTENT,
    headers=SSE_HEADERS,
)
@document_plain_response(
    204,
    "The job has ended and the client has seen every event (its `Last-Event-ID` is at or past the end): "
    "nothing to stream, and an EventSource stops reconnecting.",
)
@document_errors(
    403, 404, 422, 503,
    descriptions={
        **_OWNED, 422: "`invalid_body`: `Last-Event-ID` is not an event id (`<ms>-<seq>` or `<ms>-<seq>.<k>`).",
    },
)
async def job_events(job_id: str, headers: SseHeaders) -> Response:
    """Follow the job: its transitions and progress reports, streamed as they happen (text/event-stream)."""
    state = await owned_state(job_id)
    body = await job_stream(
        runtime().client, job_id, finished=state.is_terminal, last_event_id=headers.last_event_id,
        heartbeat_s=heartbeat_seconds(),
    )
    if body is None:
        return Response(status=204)
    return sse_response(body)


@blueprint.get("/<job_id>/result")
@tag(["jobs"])
@validate_querystring(ResultQuery)
@document_plain_response(
    200,
    "The job's large result, streamed with the Content-Type it was stored with, which varies with the job: "
    "`text/calendar; charset=utf-8` for an ICS export, `application/octet-stream` or any other type for "
    "other jobs' results.",
    content={
        "text/calendar": {"schema": {"type": "string"}},
        "*/*": {"schema": {"type": "string", "format": "binary"}},
    },
    headers={
        "Content-Length": {"description": "The size of the result in bytes.", "schema": {"type": "integer"}},
        "Content-Disposition": {
            "description": "With `download=true` only: `attachment; filename=<the result's filename>`.",
            "schema": {"type": "string"},
        },
    },
)
@document_errors(
    403, 404, 409, 410, 422, 503,
    descriptions={
        **_OWNED,
        409: "`job_not_finished`: the job has not ended yet; poll `GET /jobs/{job_id}` until it is SUCCESS.",
        410: "`no_result` (the job failed or was canceled), `no_large_result` (its result is all in "
             "`GET /jobs/{job_id}`) or `result_gone` (expired or purged).",
        422: "`invalid_body`: `download` is not a boolean.",
    },
)
async def get_result(job_id: str, query_args: ResultQuery) -> Response:
    """The large result, streamed with its native Content-Type; ?download=true makes it an attachment."""
    state = await owned_state(job_id)
    ref = _large_result_ref(state)
    stream = await runtime().client.get_large_store().open(ref)
    if stream is None:
        raise ApiError(410, "result_gone", "the result is no longer available (expired or purged)")
    response = Response(_chunks(stream, job_id), content_type=stream.content_type)
    response.headers["Content-Length"] = str(stream.size_bytes)
    if query_args.download:
        response.headers.set("Content-Disposition", "attachment", filename=_filename(state))
    return response


def _large_result_ref(state: JobState) -> str:
    if state.status in ACTIVE:
        raise ApiError(
            409, "job_not_finished", f"the job is {state.status.value}: poll GET /jobs/<id> until it is SUCCESS"
        )
    if state.status is not JobStatus.SUCCESS:
        raise ApiError(410, "no_result", f"the job ended {state.status.value}: it has no result")
    ref: Any = (state.result or {}).get("large_result")
    # A missing or non-string reference (stale wire format) is "no result", never a 500.
    if not isinstance(ref, str) or not runtime().client.get_large_store().is_reference(ref):
        raise ApiError(410, "no_large_result", "this job has no large result; its result is in GET /jobs/<id>")
    return ref


def _filename(state: JobState) -> str:
    name: Any = (state.result or {}).get("filename")
    if isinstance(name, str) and name and "/" not in name and "\\" not in name and name.isprintable():
        return name
    return f"{state.job_id}.bin"


async def _chunks(stream: BlobStream, job_id: str) -> AsyncIterator[bytes]:
    # One chunk is held back until the store's iterator is exhausted: its whole-blob check has passed
    # and its connection is closed before the client can see a complete body (and hang up).
    pending: bytes | None = None
    try:
        async for chunk in stream.iter_chunks():
            if pending is not None:
                yield pending
            pending = chunk
    except StorageError:
        # Headers are sent already: the client sees a truncated body, the log says why.
        logger.exception("job %s: streaming the large result failed", job_id)
        raise
    if pending is not None:
        yield pending
