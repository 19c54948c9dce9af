"""GET /metrics: the namespace's Prometheus metrics, behind a token of their own (AGENT_METRICS_TOKEN).

A scraper is no user: it gets neither a signed user token nor an admin one, only this bearer
token, compared in constant time. Without the setting the route answers exactly what an unknown
URL does (404), so a deployment that does not scrape shows nothing.
"""

from __future__ import annotations

import hmac

from quart import Blueprint, Response, request
from quart_schema import tag
from werkzeug.exceptions import NotFound

from agent_async.metrics import render
from agent_async.metrics.collector import CONTENT_TYPE
from app.api.context import runtime
from app.api.openapi import document_errors, document_plain_response
from app.errors import ApiError

__all__ = ["ENDPOINT", "blueprint"]

blueprint = Blueprint("metrics", __name__)

# The app's `authenticate` hook leaves this endpoint to its own token check.
ENDPOINT = "metrics.metrics"


def _check_token(expected: str) -> None:
    header = request.headers.get("Authorization")
    if not header:
        raise ApiError(401, "missing_token", "send Authorization: Bearer <AGENT_METRICS_TOKEN>")
    scheme, _, token = header.partition(" ")
    # compare_digest on bytes: no early exit on the first differing character (and no str limits).
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise ApiError(401, "invalid_token", "the metrics token is not valid")


@blueprint.get("/metrics")
@tag(["metrics"])
@document_plain_response(
    200,
    "The Prometheus text exposition (docs/metrics.md). The bearer token is `AGENT_METRICS_TOKEN`, not a "
    "user's token.",
    content={"text/plain": {"schema": {"type": "string"}}},
)
@document_errors(404, 503, descriptions={404: "`not_found`: `AGENT_METRICS_TOKEN` is not set (the endpoint is off)."})
async def metrics() -> Response:
    """Job, queue, worker, guard and group metrics of the namespace, summed over every worker."""
    settings = runtime().settings
    if settings.metrics_token is None:
        raise ApiError(404, "not_found", NotFound.description)
    _check_token(settings.metrics_token)
    body = await render(runtime().client, guard=runtime().ics_guard)
    return Response(body, status=200, content_type=CONTENT_TYPE)
