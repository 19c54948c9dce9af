"""The /admin/ui blueprint: server-rendered pages (overview, jobs, schedules, runs, guards, workers), their
actions and the live event stream. Pages read the same library calls as the admin JSON API."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from quart import Blueprint, Response, g, render_template, request, send_from_directory, url_for
from quart_schema import hide

from agent_async import ACTIVE, JobEvent, JobState, JobStatus, RequestRefusedError
from agent_async.lifecycle import now_ms
from agent_async.runs import RunRecord, RunStatus
from agent_async.schedules.cron import cron_problem, next_fire
from agent_async.schedules.scheduler import ScheduleView
from agent_async.store.events import EVENT_ID_PATTERN, EventType
from agent_async.store.listing import JobOrder
from app.api.sse import admin_stream, heartbeat_seconds, sse_response
from app.dashboard.security import (
    CSRF_FIELD,
    CSRF_HEADER,
    DashboardError,
    current_session,
    gate,
    secure_headers,
    see_other,
    set_session_cookie,
    signer,
)
from app.dashboard.session import COOKIE_NAME, SignInError
from app.runtime import AppRuntime, current_runtime

__all__ = ["blueprint"]

logger = logging.getLogger(__name__)

blueprint = Blueprint("dashboard", __name__, url_prefix="/admin/ui", template_folder="templates")
blueprint.before_request(gate)
blueprint.after_request(secure_headers)

PAGE_SIZE = 50
# A bulk action touches at most this many jobs per confirmation (the page says how many are left).
BULK_MAX = 1000
NEXT_FIRES = 5
RECENT_SKIPS = 5
CHANGES_SHOWN = 10
TIMELINE_EVENTS = 100
# A cancel waits this long for a running job to stop, so the page can show it CANCELED.
CANCEL_WAIT_S = 5.0
_MAX_ID_CHARS = 128
_EVENT_ID = re.compile(EVENT_ID_PATTERN)


class Notice(StrEnum):
    """What the page after an action says: a fixed text chosen by code, never a text from the URL."""

    CANCELLED = "cancelled"
    CANCEL_REQUESTED = "cancel_requested"
    RETRIED = "retried"
    SCHEDULE_SAVED = "schedule_saved"
    GUARD_RESET = "guard_reset"
    RUN_CANCELLED = "run_cancelled"
    BULK_DONE = "bulk_done"
    SIGNED_OUT = "signed_out"


NOTICES = {
    Notice.CANCELLED: "The job was cancelled.",
    Notice.CANCEL_REQUESTED: "Cancellation requested: the job stops at its next check.",
    Notice.RETRIED: "The job was queued again under a new id (this is the new job).",
    Notice.SCHEDULE_SAVED: "The schedule was saved.",
    Notice.GUARD_RESET: "The connection's cooldown and failures were reset.",
    Notice.RUN_CANCELLED: "The run was cancelled.",
    Notice.BULK_DONE: "The bulk action is done.",
    Notice.SIGNED_OUT: "You are signed out.",
}


class BulkAction(StrEnum):
    RETRY_FAILED = "retry_failed"
    CANCEL_QUEUED = "cancel_queued"


def _rt() -> AppRuntime:
    return current_runtime()


async def _page(template: str, *, status: int = 200, **context: Any) -> Response:
    session = current_session()
    notice_code = request.args.get("notice")
    notice = NOTICES.get(Notice(notice_code)) if notice_code in set(Notice) else None
    html = await render_template(
        template, session=session, may_act=session.may_act, events_after=g.get("events_after", ""),
        csrf_field=CSRF_FIELD, csrf_header=CSRF_HEADER,
        csrf_token=session.csrf_token, notice=notice, job_names=sorted(_rt().agent.registry.requests()),
        **context,
    )
    return Response(html, status=status, content_type="text/html; charset=utf-8")


@blueprint.errorhandler(DashboardError)
async def dashboard_error(error: DashboardError) -> Response:
    html = await render_template("error.html", status=error.status, message=error.message)
    response = Response(html, status=error.status, content_type="text/html; charset=utf-8")
    if error.status == 401:
        response.headers["WWW-Authenticate"] = 'Cookie realm="dashboard"'
    return response


_STATIC = Path(__file__).resolve().parent / "static"


@blueprint.get("/static/<path:filename>")
@hide
async def static(filename: str) -> Response:
    """The pages' CSS and JavaScript (no CDN, nothing fetched from elsewhere); hidden from the OpenAPI document."""
    return await send_from_directory(_STATIC, filename)


# -- sign-in -----------------------------------------------------------------------------------


@blueprint.get("/login")
@hide
async def login_form() -> Response:
    notice = NOTICES[Notice.SIGNED_OUT] if request.args.get("notice") == Notice.SIGNED_OUT else None
    html = await render_template("login.html", error=None, notice=notice)
    return Response(html, content_type="text/html; charset=utf-8")


@blueprint.post("/login")
@hide
async def login() -> Response:
    form = await request.form
    try:
        session, cookie = signer().exchange(form.get("token", ""))
    except SignInError as exc:
        html = await render_template("login.html", error=str(exc), notice=None)
        return Response(html, status=401, content_type="text/html; charset=utf-8")
    logger.info("dashboard: %s signed in as %s", session.uid, session.role.value)
    response = see_other(url_for("dashboard.overview"))
    set_session_cookie(response, cookie, max_age_s=signer().session_max_age_s)
    return response


@blueprint.post("/logout")
@hide
async def logout() -> Response:
    response = see_other(url_for("dashboard.login_form", notice=Notice.SIGNED_OUT.value))
    response.delete_cookie(COOKIE_NAME, path="/admin/ui", httponly=True, samesite="Strict")
    return response


# -- overview ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TypeCounts:
    name: str
    by_status: dict[JobStatus, int]


async def _type_counts(rt: AppRuntime) -> tuple[list[TypeCounts], int]:
    since_ms = now_ms() - rt.settings.agent.state_retention_s * 1000
    found = await rt.client.listing.overview_counts(since_ms=since_ms)
    counts: dict[str, dict[JobStatus, int]] = {}
    for source in (found.ended, found.active):
        for (name, status), n in source.items():
            by = counts.setdefault(name, {})
            by[status] = by.get(status, 0) + n
    return [TypeCounts(name, by) for name, by in sorted(counts.items())], sum(found.active.values())


@blueprint.get("/")
@hide
async def overview() -> Response:
    rt = _rt()
    hour_ago_ms = now_ms() - 3_600_000
    listing = rt.client.listing
    # Independent reads, each a round trip or two: concurrently, the page costs about the slowest.
    # (Two gathers: typeshed types asyncio.gather's results for at most six awaitables.)
    (counts, active), stats, finished, failed = await asyncio.gather(
        _type_counts(rt), rt.client.queue_stats(), listing.ended_since(JobStatus.SUCCESS, hour_ago_ms),
        listing.ended_since(JobStatus.FAILURE, hour_ago_ms),
    )
    workers, views, guard_states = await asyncio.gather(
        rt.client.workers(), rt.client.schedules.views(), rt.ics_guard.states(),
    )
    upcoming = sorted((v for v in views if v.next_run is not None), key=lambda v: v.next_run or datetime.max)
    guards = [g for g in guard_states if g.state.value != "closed" or g.failures > 0]
    return await _page(
        "overview.html",
        counts=counts, statuses=list(JobStatus), active=active, stats=stats, finished_hour=finished,
        failed_hour=failed, workers=len(workers), guards=guards, upcoming=upcoming[:10],
    )


# -- jobs ----------------------------------------------------------------------------------------


def _arg(name: str, max_chars: int = 255) -> str | None:
    value = (request.args.get(name) or "").strip()
    if not value:
        return None
    if len(value) > max_chars or not value.isprintable():
        raise DashboardError(422, f"{name} must be 1-{max_chars} printable characters")
    return value


def _status_arg() -> JobStatus | None:
    value = _arg("status")
    if value is None:
        return None
    try:
        return JobStatus(value.upper())
    except ValueError:
        raise DashboardError(422, f"status must be one of {', '.join(JobStatus)}") from None


def _cursor_arg() -> int:
    value = _arg("cursor", 12)
    if value is None:
        return 0
    if not value.isdigit():
        raise DashboardError(422, "cursor must be a non-negative integer")
    return int(value)


def _order_arg() -> JobOrder:
    value = _arg("sort", 16)
    if value is None:
        return JobOrder.NEWEST
    try:
        return JobOrder(value.lower())
    except ValueError:
        raise DashboardError(422, f"sort must be one of {', '.join(JobOrder)}") from None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _created_arg(name: str) -> tuple[int, str] | None:
    """A creation time bound: (epoch ms, its UTC text for the form field and the paging links).

    `<input type="datetime-local">` sends `YYYY-MM-DDTHH:MM` with no zone: it is read as UTC, like every
    time on these pages; an ISO 8601 time with a zone (`Z`, `+02:00`) is converted to UTC.
    """
    value = _arg(name, 40)
    if value is None:
        return None
    problem = f"{name} must be a time as YYYY-MM-DDTHH:MM (UTC) or ISO 8601 with a zone"
    try:
        at = datetime.fromisoformat(value)
        at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    except (ValueError, OverflowError):
        raise DashboardError(422, problem) from None
    if at < _EPOCH:
        raise DashboardError(422, f"{name} must be after 1970-01-01T00:00 UTC")
    # datetime-local accepts seconds and fractions too; the text keeps the bound exact to the ms.
    text = at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3].removesuffix(":00.000").removesuffix(".000")
    return (at - _EPOCH) // timedelta(milliseconds=1), text


@blueprint.get("/jobs")
@hide
async def jobs() -> Response:
    rt = _rt()
    search = _arg("q", _MAX_ID_CHARS)
    if search is not None:
        if await rt.client.get_state(search) is not None:
            return see_other(url_for("dashboard.job_detail", job_id=search))
        return await _page("jobs.html", status=404, page=None, filters={}, search=search, live_insert=False)
    status, job, user = _status_arg(), _arg("job"), _arg("user")
    order, since, until = _order_arg(), _created_arg("since"), _created_arg("until")
    if since is not None and until is not None and since[0] >= until[0]:
        raise DashboardError(422, "since must be before until")
    cursor = _cursor_arg()
    page = await rt.client.listing.list_page(
        status=status, name=job, user_uid=user, order=order,
        created_since_ms=None if since is None else since[0], created_until_ms=None if until is None else until[0],
        cursor=cursor, limit=PAGE_SIZE,
    )
    filters = {
        "status": None if status is None else status.value, "job": job, "user": user,
        "since": None if since is None else since[1], "until": None if until is None else until[1],
        "sort": None if order is JobOrder.NEWEST else order.value,
    }
    query: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
    next_url = None if page.next_cursor is None else url_for("dashboard.jobs", cursor=page.next_cursor, **query)
    return await _page(
        "jobs.html", page=page, rows=[_row(s) for s in page.states], filters=query, search=None,
        next_url=next_url, first_url=url_for("dashboard.jobs", **query) if cursor else None,
        # New jobs are prepended live on the first page of the newest first, open-ended list only:
        # further pages are positions in an index, and a new job is after any `until`.
        live_insert=cursor == 0 and order is JobOrder.NEWEST and until is None, statuses=list(JobStatus),
        orders=list(JobOrder),
    )


def _iso(ms: int | None) -> str:
    return "" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _row(state: JobState) -> dict[str, Any]:
    fraction = (state.progress or {}).get("fraction") if state.status in ACTIVE else None
    return {
        "id": state.job_id, "name": state.name, "status": state.status.value, "user": state.user_uid or "",
        "attempts": state.attempts, "created": _iso(state.created_ms), "finished": _iso(state.finished_ms),
        "fraction": 1.0 if state.status is JobStatus.SUCCESS else fraction,
    }


async def _state_or_404(job_id: str) -> JobState:
    if len(job_id) > _MAX_ID_CHARS:
        raise DashboardError(404, "no such job")
    state = await _rt().client.get_state(job_id)
    if state is None:
        raise DashboardError(404, "no such job")
    return state


@blueprint.get("/jobs/<job_id>")
@hide
async def job_detail(job_id: str) -> Response:
    rt = _rt()
    state = await _state_or_404(job_id)
    public = rt.serializer.dump(state)
    events = await rt.agent.events.latest(TIMELINE_EVENTS, job_id=job_id)
    group_id = await rt.client.listing.group_id_of(job_id)
    group = None if group_id is None else await rt.client.get_group(group_id)
    return await _page(
        "job.html", job=_row(state), state=state, public=public, group=group,
        payload_json=_pretty(public["payload"]), result_json=_pretty(public["result"]),
        timeline=_timeline(events),
        may_cancel=state.status in ACTIVE, may_retry=state.status in (JobStatus.FAILURE, JobStatus.CANCELED),
    )


def _timeline(events: list[JobEvent]) -> list[dict[str, Any]]:
    """Every transition, and of a run of progress reports only the latest: a long job reports hundreds."""
    shown: list[dict[str, Any]] = []
    for event in events:
        entry = {**event.to_dict(), "at": _iso(event.at_ms)}
        if event.type is EventType.PROGRESS and shown and shown[-1]["type"] == EventType.PROGRESS.value:
            shown[-1] = entry
        else:
            shown.append(entry)
    return shown


def _pretty(value: Any) -> str | None:
    return None if value is None else json.dumps(value, indent=2, sort_keys=True, default=str)


@blueprint.post("/jobs/<job_id>/cancel")
@hide
async def cancel_job(job_id: str) -> Response:
    await _state_or_404(job_id)
    state = await _rt().client.cancel(job_id, wait_s=CANCEL_WAIT_S)
    logger.info("dashboard: %s cancelled job %s", current_session().uid, job_id)
    notice = Notice.CANCELLED if state is not None and state.is_terminal else Notice.CANCEL_REQUESTED
    return see_other(url_for("dashboard.job_detail", job_id=job_id, notice=notice.value))


@blueprint.post("/jobs/<job_id>/retry")
@hide
async def retry_job(job_id: str) -> Response:
    await _state_or_404(job_id)
    try:
        new_id = await _rt().client.retry(job_id)
    except RequestRefusedError as exc:
        raise DashboardError(409, str(exc)) from None
    if new_id is None:
        raise DashboardError(404, "no such job")
    logger.info("dashboard: %s retried job %s as %s", current_session().uid, job_id, new_id)
    return see_other(url_for("dashboard.job_detail", job_id=new_id, notice=Notice.RETRIED.value))


# -- bulk actions --------------------------------------------------------------------------------


def _bulk_args(values: Any) -> tuple[BulkAction, str]:
    action, job = values.get("action"), values.get("job")
    if action not in set(BulkAction):
        raise DashboardError(422, f"action must be one of {', '.join(BulkAction)}")
    if job not in _rt().agent.registry.requests():
        raise DashboardError(422, "job must be a registered job type")
    return BulkAction(action), str(job)


async def _bulk_targets(action: BulkAction, job: str) -> list[str]:
    client = _rt().client
    failed = action is BulkAction.RETRY_FAILED
    statuses = [JobStatus.FAILURE] if failed else [JobStatus.PENDING, JobStatus.RETRY]
    ids: list[str] = []
    for status in statuses:
        page = await client.list_page(status=status, name=job, limit=BULK_MAX, scan_limit=50 * BULK_MAX)
        ids += [s.job_id for s in page.states]
    return ids[:BULK_MAX]


@blueprint.get("/bulk")
@hide
async def bulk_confirm() -> Response:
    """The confirmation step: what would be done, to how many jobs; nothing changes until it is posted."""
    action, job = _bulk_args(request.args)
    targets = await _bulk_targets(action, job)
    return await _page("bulk.html", action=action.value, job=job, count=len(targets), bulk_max=BULK_MAX)


@blueprint.post("/bulk")
@hide
async def bulk_run() -> Response:
    action, job = _bulk_args(await request.form)
    client = _rt().client
    done = 0
    for job_id in await _bulk_targets(action, job):
        try:
            if action is BulkAction.RETRY_FAILED:
                done += await client.retry(job_id) is not None
            else:
                done += await client.cancel(job_id) is not None
        except RequestRefusedError:
            continue  # ended otherwise meanwhile (or its job type is gone): nothing to do for it
    logger.info("dashboard: %s ran %s on %d %s job(s)", current_session().uid, action.value, done, job)
    status = JobStatus.FAILURE if action is BulkAction.RETRY_FAILED else JobStatus.CANCELED
    return see_other(url_for("dashboard.jobs", job=job, status=status.value, notice=Notice.BULK_DONE.value))


# -- schedules -----------------------------------------------------------------------------------


async def _schedule_rows(refused: dict[str, tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """Every schedule as the page shows it; `refused` maps a schedule to (the parser's reason, the cron
    typed), so the field keeps what the operator typed next to why it was not saved."""
    scheduler = _rt().client.schedules
    rows = []
    for view in await scheduler.views():
        rows.append({
            "view": view,
            "next_fires": _next_fires(view, scheduler.timezone),
            "skips": await scheduler.skips(view.name, limit=RECENT_SKIPS),
            "changes": await _changes(view.name),
            "error": (refused or {}).get(view.name, (None, None))[0],
            "submitted": (refused or {}).get(view.name, (None, None))[1],
            "last_run_at": "" if view.last_run is None else _iso(view.last_run.created_ms),
        })
    return rows


def _next_fires(view: ScheduleView, timezone: Any) -> list[str]:
    if view.effective_cron is None or not view.enabled:
        return []
    fires, at = [], datetime.now(timezone)
    for _ in range(NEXT_FIRES):
        at = next_fire(view.effective_cron, at)
        fires.append(at.strftime("%Y-%m-%d %H:%M %Z"))
    return fires


async def _changes(name: str) -> list[dict[str, Any]]:
    changes = await _rt().client.schedules.overrides.changes(name, limit=CHANGES_SHOWN)
    return [
        {"at": _iso(c.changed_at_ms), "by": c.changed_by, "what": json.dumps(c.change, sort_keys=True)}
        for c in changes
    ]


@blueprint.get("/schedules")
@hide
async def schedules() -> Response:
    return await _page("schedules.html", rows=await _schedule_rows())


@blueprint.post("/schedules/<name>")
@hide
async def save_schedule(name: str) -> Response:
    scheduler = _rt().client.schedules
    if name not in scheduler.schedules():
        raise DashboardError(404, "no such schedule")
    form = await request.form
    changes: dict[str, Any] = {}
    if form.get("enabled") in ("true", "false"):
        changes["enabled"] = form["enabled"] == "true"
    if "cron" in form:
        cron = form["cron"].strip()
        problem = cron_problem(cron) if cron else None
        if problem is not None:
            # The parser's reason, next to the field; nothing is saved.
            return await _page("schedules.html", status=422, rows=await _schedule_rows({name: (problem, cron)}))
        changes["cron"] = cron or None  # empty: back to the declared cron
    if not changes:
        raise DashboardError(422, "send enabled=true|false and/or cron")
    await scheduler.overrides.set(name, by=current_session().uid, **changes)
    logger.info("dashboard: %s changed schedule %s", current_session().uid, name)
    return see_other(url_for("dashboard.schedules", notice=Notice.SCHEDULE_SAVED.value))


# -- runs, guards, workers -----------------------------------------------------------------------


def _run_row(run: RunRecord) -> dict[str, Any]:
    end_ms = run.finished_ms if run.finished_ms is not None else now_ms()
    return {
        "run": run, "started": _iso(run.started_ms), "finished": _iso(run.finished_ms),
        "duration_s": f"{(end_ms - run.started_ms) / 1000:.1f}",
        "counters": " · ".join(f"{name} {value}" for name, value in sorted(run.counters.items())),
        "failed": ", ".join(run.failed_ids[:20]),
        "failed_more": max(0, len(run.failed_ids) - 20),
    }


@blueprint.get("/runs")
@hide
async def runs() -> Response:
    status_value = _arg("status")
    if status_value is not None and status_value not in set(RunStatus):
        raise DashboardError(422, f"status must be one of {', '.join(RunStatus)}")
    before, kind = _arg("before", 64), _arg("kind", 200)
    try:
        records = await _rt().agent.runs.list(
            kind=kind, status=None if status_value is None else RunStatus(status_value),
            limit=PAGE_SIZE, before=before,
        )
    except ValueError:
        raise DashboardError(422, "before must be a cursor from this page's link") from None
    # The next page keeps the filters it was asked with (url_for leaves out those that are None).
    next_url = (url_for("dashboard.runs", before=records[-1].cursor, status=status_value, kind=kind)
                if len(records) == PAGE_SIZE else None)
    return await _page(
        "runs.html", rows=[_run_row(r) for r in records], next_url=next_url, run_statuses=list(RunStatus),
        status_filter=status_value, kind_filter=kind or "",
    )


@blueprint.post("/runs/<run_id>/cancel")
@hide
async def cancel_run(run_id: str) -> Response:
    """Cancel a running run: recorded `cancelled`, its group and its job cancelled."""
    rt = _rt()
    run = await rt.agent.runs.get(run_id)
    if run is None:
        raise DashboardError(404, "no such run")
    if run.status is not RunStatus.RUNNING:
        raise DashboardError(409, f"the run has ended ({run.status.value})")
    # Its group too: a sweep's job has ended long before its group (ClientAgent.cancel_run).
    await rt.client.cancel_run(run, reason=f"cancelled from the dashboard by {current_session().uid}",
                               wait_s=CANCEL_WAIT_S)
    logger.info("dashboard: %s cancelled run %s", current_session().uid, run_id)
    return see_other(url_for("dashboard.runs", notice=Notice.RUN_CANCELLED.value))


@blueprint.get("/guards")
@hide
async def guards() -> Response:
    rows = [
        {"guard": g, "cooldown_until": _iso(g.cooldown_until_ms) if g.state.value == "open" else "",
         "last_error_at": _iso(g.last_error_ms)}
        for g in await _rt().ics_guard.states()
    ]
    return await _page("guards.html", rows=rows)


@blueprint.post("/guards/<path:name>/reset")
@hide
async def reset_guard(name: str) -> Response:
    guard = _rt().ics_guard
    if name not in {g.name for g in await guard.states()}:
        raise DashboardError(404, "no such connection")
    await guard.reset(name)
    logger.warning("dashboard: %s reset connection guard %s", current_session().uid, name)
    return see_other(url_for("dashboard.guards", notice=Notice.GUARD_RESET.value))


@blueprint.get("/workers")
@hide
async def workers() -> Response:
    rows = [
        {"worker": w, "started": _iso(w.started_ms), "heartbeat": _iso(w.heartbeat_ms)}
        for w in await _rt().client.workers()
    ]
    return await _page("workers.html", rows=rows)


# -- live ----------------------------------------------------------------------------------------


@blueprint.get("/events")
@hide
async def events() -> Response:
    """Every job's events for the pages' live updates (the admin stream; the session authenticates it).

    An EventSource resumes with Last-Event-ID itself; `after` lets the page's own reconnect do the same.
    """
    after = request.headers.get("Last-Event-ID") or request.args.get("after")
    if after is not None and not _EVENT_ID.match(after):
        raise DashboardError(422, "Last-Event-ID must be an event id (<ms>-<seq> or <ms>-<seq>.<k>)")
    body = await admin_stream(
        _rt().client, name=None, user_uid=None, status=None, last_event_id=after, heartbeat_s=heartbeat_seconds(),
    )
    return sse_response(body)

