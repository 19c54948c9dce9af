"""The /admin blueprint: every schedule (disable it or replace its cron at runtime), every job's
events as they happen, the live workers, the run records (cancel a running one), the guarded
outside connections (reset a cooldown)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from quart import Blueprint, Response, jsonify, request
from quart_schema import document_request, document_response, tag, validate_headers, validate_querystring

from agent_async import GuardState, JobStatus, RunRecord, RunStatus
from agent_async.schedules.cron import cron_problem
from agent_async.schedules.scheduler import Scheduler, ScheduleView
from agent_async.store.workers import WorkerInfo
from app.api.context import current_principal, runtime
from app.api.openapi import document_errors, document_plain_response
from app.api.schemas import (
    EventsQuery,
    GuardList,
    GuardOut,
    RunList,
    RunOut,
    RunsQuery,
    ScheduleList,
    SchedulePatch,
    WorkerList,
)
from app.api.schemas import ScheduleView as ScheduleViewOut
from app.api.sse import SSE_CONTENT, SSE_HEADERS, SseHeaders, admin_stream, heartbeat_seconds, sse_response
from app.errors import ApiError

__all__ = ["blueprint"]

logger = logging.getLogger(__name__)

blueprint = Blueprint("admin", __name__, url_prefix="/admin")

# Skipped ticks shown with each schedule, newest first.
RECENT_SKIPS = 5
_FORBIDDEN = {403: "`forbidden`: the token is not an admin token."}


def _require_admin() -> None:
    if not current_principal().admin:
        raise ApiError(403, "forbidden", "an admin token is required")


def _scheduler() -> Scheduler:
    _require_admin()
    return runtime().client.schedules


@blueprint.get("/events")
@tag(["admin"])
@validate_querystring(EventsQuery)
@validate_headers(SseHeaders)
@document_plain_response(
    200,
    "Every job's events from now on (or after `Last-Event-ID`), filtered by `job` (name), `user` and "
    "`status`, as Server-Sent Events; each `data` is a JobEventOut, `: keep-alive` comments while idle. "
    "The stream does not end by itself.",
    content=SSE_CONTENT,
    headers=SSE_HEADERS,
)
@document_errors(
    403, 422, 503,
    descriptions={
        **_FORBIDDEN,
        422: "`invalid_body`: an unknown query parameter, a `status` that is no job status, an empty "
             "filter, or a `Last-Event-ID` that is not an event id (`<ms>-<seq>` or `<ms>-<seq>.<k>`).",
    },
)
async def follow_events(query_args: EventsQuery, headers: SseHeaders) -> Response:
    """Follow every job's transitions and progress reports (text/event-stream)."""
    _require_admin()
    body = await admin_stream(
        runtime().client,
        name=query_args.job,
        user_uid=query_args.user,
        status=None if query_args.status is None else JobStatus(query_args.status),
        last_event_id=headers.last_event_id,
        heartbeat_s=heartbeat_seconds(),
    )
    return sse_response(body)


@blueprint.get("/workers")
@tag(["admin"])
@document_response(WorkerList)
@document_errors(403, 503, descriptions=_FORBIDDEN)
async def list_workers() -> Response:
    """The worker processes alive now: id, host, pid, since when, jobs running, last heartbeat."""
    _require_admin()
    return jsonify({"workers": [_worker_json(worker) for worker in await runtime().client.workers()]})


def _worker_json(worker: WorkerInfo) -> dict[str, Any]:
    return {
        "worker_id": worker.worker_id,
        "host": worker.host,
        "pid": worker.pid,
        "started_at": _iso(worker.started_ms),
        "jobs_running": worker.jobs_running,
        "heartbeat_at": _iso(worker.heartbeat_ms),
    }


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _iso(ms: int) -> str:
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat()


def _iso_or_none(ms: int | None) -> str | None:
    return None if ms is None else _iso(ms)


@blueprint.get("/runs")
@tag(["admin"])
@validate_querystring(RunsQuery)
@document_response(RunList)
@document_errors(
    403, 422, 503,
    descriptions={
        **_FORBIDDEN,
        422: "`invalid_body`: an unknown query parameter, a `status` that is no run status, a `limit` "
             "outside 1-100 or a `before` that is not a page's `next`.",
    },
)
async def list_runs(query_args: RunsQuery) -> Response:
    """Run records newest first, filtered by `kind` and `status`; `before=<next>` gives the next page."""
    _require_admin()
    status = None if query_args.status is None else RunStatus(query_args.status)
    # One more than asked: whether a next page exists, without a count query.
    found = await runtime().agent.runs.list(
        kind=query_args.kind, status=status, limit=query_args.limit + 1, before=query_args.before,
    )
    page = found[: query_args.limit]
    more = len(found) > query_args.limit
    return jsonify({"runs": [_run_json(run) for run in page], "next": page[-1].cursor if more else None})


@blueprint.get("/runs/<run_id>")
@tag(["admin"])
@document_response(RunOut)
@document_errors(403, 404, 503, descriptions={**_FORBIDDEN, 404: "`run_not_found`."})
async def get_run(run_id: str) -> Response:
    """One run record."""
    _require_admin()
    return jsonify(_run_json(await _run(run_id)))


@blueprint.post("/runs/<run_id>/cancel")
@tag(["admin"])
@document_response(RunOut)
@document_errors(
    403, 404, 409, 503,
    descriptions={**_FORBIDDEN, 404: "`run_not_found`.", 409: "`run_not_running`: the run has already ended."},
)
async def cancel_run(run_id: str) -> Response:
    """Cancel a running run: record it `cancelled` with who asked, then cancel its group (queued and
    waiting items canceled, running ones stopped) and its job."""
    _require_admin()
    run = await _run(run_id)
    if run.status is not RunStatus.RUNNING:
        raise ApiError(409, "run_not_running", f"the run has already ended ({run.status.value})")
    ended = await runtime().client.cancel_run(run, reason=f"cancelled by {current_principal().uid}")
    return jsonify(_run_json(ended))


async def _run(run_id: str) -> RunRecord:
    found = await runtime().agent.runs.get(run_id)
    if found is None:
        raise ApiError(404, "run_not_found", "no such run")
    return found


def _run_json(run: RunRecord) -> dict[str, Any]:
    duration_s = None if run.finished_ms is None else (run.finished_ms - run.started_ms) / 1000
    return {**run.to_dict(), "duration_s": duration_s}


@blueprint.get("/guards")
@tag(["admin"])
@document_response(GuardList)
@document_errors(403, 503, descriptions=_FORBIDDEN)
async def list_guards() -> Response:
    """Every guarded outside connection with a recorded state, most recently used first: circuit
    (closed / open / half-open), failures in a row, cooldown, trial in flight, pacing, last error."""
    _require_admin()
    return jsonify({"guards": [_guard_json(state) for state in await runtime().ics_guard.states()]})


@blueprint.post("/guards/<path:name>/reset")
@tag(["admin"])
@document_response(GuardOut)
@document_errors(403, 404, 503, descriptions={**_FORBIDDEN, 404: "`guard_not_found`: not a connection name."})
async def reset_guard(name: str) -> Response:
    """Forget a connection's failures and cooldown (it starts again closed); logged with who asked."""
    _require_admin()
    if not 1 <= len(name) <= 255 or not name.isprintable():
        raise ApiError(404, "guard_not_found", "no such connection")
    logger.warning("connection %s: reset requested by %s", name, current_principal().uid)
    return jsonify(_guard_json(await runtime().ics_guard.reset(name)))


def _guard_json(state: GuardState) -> dict[str, Any]:
    return {
        "name": state.name,
        "state": state.state.value,
        "failures": state.failures,
        "cooldown_until": _iso_or_none(state.cooldown_until_ms),
        "retry_after_s": state.retry_after_s,
        "trial_in_flight_until": _iso_or_none(state.trial_until_ms),
        "next_slot_at": _iso_or_none(state.next_slot_ms),
        "last_error": state.last_error,
        "last_error_at": _iso_or_none(state.last_error_ms),
        "observed_at": _iso(state.observed_ms),
    }


@blueprint.get("/schedules")
@tag(["admin"])
@document_response(ScheduleList)
@document_errors(403, 503, descriptions=_FORBIDDEN)
async def list_schedules() -> Response:
    """Every schedule: code default, override, effective cron, enabled, last run, next run, skips."""
    scheduler = _scheduler()
    return jsonify({"schedules": [await _view_json(scheduler, view) for view in await scheduler.views()]})


async def _view_json(scheduler: Scheduler, view: ScheduleView) -> dict[str, Any]:
    """A schedule as both endpoints answer it (app.api.schemas.ScheduleView)."""
    return {**view.to_dict(), "recent_skips": await scheduler.skips(view.name, limit=RECENT_SKIPS)}


@blueprint.patch("/schedules/<name>")
@tag(["admin"])
@document_request(SchedulePatch)
@document_response(ScheduleViewOut)
@document_errors(
    400, 403, 404, 408, 413, 422, 503,
    descriptions={
        **_FORBIDDEN,
        404: "`schedule_not_found`.",
        422: "`invalid_body` (not such a JSON object, or not sent as `application/json`) or `invalid_cron` "
             "(the cron does not parse: the parser's reason).",
    },
)
async def patch_schedule(name: str) -> Response:
    """Enable or disable a schedule, or replace its cron (null restores the declared one)."""
    scheduler = _scheduler()
    if name not in scheduler.schedules():
        raise ApiError(404, "schedule_not_found", f"no schedule {name}")
    # Not silent: an unparseable body is a 400 bad_request (as on every endpoint); a body that
    # parses but is not the expected object is a 422 below.
    body = await request.get_json()
    changes = _validated(body)
    await scheduler.overrides.set(name, by=current_principal().uid, **changes)
    view = await scheduler.view(name)
    if view is None:  # unregistered meanwhile: cannot happen within one process
        raise ApiError(404, "schedule_not_found", f"no schedule {name}")
    return jsonify(await _view_json(scheduler, view))


def _validated(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not body:
        raise ApiError(422, "invalid_body", 'send a JSON object with "enabled" (bool) and/or "cron" (string or null)')
    unknown = sorted(set(body) - {"enabled", "cron"})
    if unknown:
        raise ApiError(422, "invalid_body", f"unknown fields: {', '.join(unknown)}")
    changes: dict[str, Any] = {}
    if "enabled" in body:
        if not isinstance(body["enabled"], bool):
            raise ApiError(422, "invalid_body", '"enabled" must be true or false')
        changes["enabled"] = body["enabled"]
    if "cron" in body:
        cron = body["cron"]
        if cron is not None:
            if not isinstance(cron, str):
                raise ApiError(422, "invalid_cron", '"cron" must be a 5-field cron string or null')
            problem = cron_problem(cron.strip())
            if problem is not None:
                raise ApiError(422, "invalid_cron", problem)
            cron = cron.strip()
        changes["cron"] = cron
    return changes
