"""The /admin/schedules blueprint: see every schedule, disable it or replace its cron at runtime."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, jsonify, request
from quart_schema import document_request, document_response, tag

from agent_async.schedules.cron import cron_problem
from agent_async.schedules.scheduler import Scheduler, ScheduleView
from app.api.context import current_principal, runtime
from app.api.openapi import document_errors
from app.api.schemas import ScheduleList, SchedulePatch
from app.api.schemas import ScheduleView as ScheduleViewOut
from app.errors import ApiError

__all__ = ["blueprint"]

blueprint = Blueprint("admin", __name__, url_prefix="/admin")

# Skipped ticks shown with each schedule, newest first.
RECENT_SKIPS = 5
_FORBIDDEN = {403: "`forbidden`: the token is not an admin token."}


def _scheduler() -> Scheduler:
    if not current_principal().admin:
        raise ApiError(403, "forbidden", "an admin token is required")
    return runtime().client.schedules


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
