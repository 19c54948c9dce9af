"""create_app: the Quart application factory wiring settings, Agent, ClientAgent, auth, blueprints, OpenAPI."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from quart import Quart, Response, g, jsonify, request
from quart_schema import Info, QuartSchema, document_response

from agent_async import Agent, ClientAgent, init_jobs
from agent_async.serializer import JobStateSerializerDict
from app import dashboard
from app.api import jobs as jobs_api
from app.api import metrics as metrics_api
from app.api.openapi import AppOpenAPIProvider, document_errors
from app.api.request import MAX_REQUEST_HEAD_BYTES, ApiRequest, request_head_bytes
from app.api.schemas import HealthOut
from app.auth import TokenSigner
from app.errors import ApiError, register_error_handlers
from app.module.admin import api as admin_api
from app.module.calendar import api as calendar_api
from app.runtime import EXTENSION_KEY, AppRuntime
from app.settings import AppSettings

__all__ = ["OPENAPI_PATH", "OWN_TOKEN_ENDPOINTS", "PUBLIC_ENDPOINTS", "create_app"]

logger = logging.getLogger(__name__)

OPENAPI_PATH = "/openapi.json"
DOCS_PATH = "/docs"
# Documentation and the health probe need no token; every API endpoint does.
PUBLIC_ENDPOINTS = frozenset({"openapi", "swagger_ui", "health"})
# Endpoints that check a bearer token of their own instead of a signed user token.
OWN_TOKEN_ENDPOINTS = frozenset({metrics_api.ENDPOINT})


def create_app(settings: AppSettings | None = None) -> Quart:
    """Build the app; nothing connects until it serves (or a worker built from it starts)."""
    settings = settings if settings is not None else AppSettings.from_env()
    # The API imports every job module too: the serializer needs each Job's public_payload.
    init_jobs(settings.agent.job_packages)

    app = Quart(__name__, static_folder=None)
    # Its get_json answers 400 for any unreadable JSON body (charset, UTF-8, nesting).
    app.request_class = ApiRequest
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    QuartSchema(
        app,
        openapi_path=OPENAPI_PATH,
        swagger_ui_path=DOCS_PATH,
        redoc_ui_path=None,
        scalar_ui_path=None,
        info=Info(title="agent-async reference API", version="0.1.0"),
        security_schemes={"bearer": {"type": "http", "scheme": "bearer"}},
        security=[{"bearer": []}],
        # Completes the generated document: 401/431, 204s, the streamed result, the upload body.
        openapi_provider_class=AppOpenAPIProvider,
    )
    runtime = _build_runtime(app, settings)
    app.extensions[EXTENSION_KEY] = runtime

    @app.before_serving
    async def start() -> None:
        settings.require_secret()
        await runtime.start_serving()
        if settings.api_gc_freeze:
            # Routes, settings, pools: alive as long as the process. Out of the collector's sight, a
            # full collection no longer walks them (measured under load: a 50-70 ms stall of every
            # request in flight about once a second without this; benchmarks/api.py).
            gc.collect()
            gc.freeze()

    @app.after_serving
    async def stop() -> None:
        await runtime.stop_serving()

    @app.before_request
    async def limit_head() -> None:
        # Before authentication: an oversized head is refused whoever sends it.
        if request_head_bytes(request.scope) > MAX_REQUEST_HEAD_BYTES:
            raise ApiError(
                431, "request_header_fields_too_large",
                f"the URL and headers together are larger than {MAX_REQUEST_HEAD_BYTES} bytes",
            )

    @app.before_request
    async def authenticate() -> None:
        # No such route, or not with this method: the 404 or 405 (with its Allow) says nothing the
        # public OpenAPI document does not, and a public route's 405 must not read as a 401.
        if request.endpoint in PUBLIC_ENDPOINTS or request.routing_exception is not None:
            return
        # /metrics checks its own token; the dashboard its session cookie (app/dashboard/security.py).
        if request.endpoint in OWN_TOKEN_ENDPOINTS or request.blueprint == dashboard.blueprint.name:
            return
        g.principal = runtime.require_signer().from_header(request.headers.get("Authorization"))

    @app.get("/health")
    @document_response(HealthOut)
    @document_errors(503, descriptions={503: "`queue_unavailable`: Redis does not answer."})
    async def health() -> Response:
        """Readiness: 200 when Redis answers (compose health check), 503 otherwise."""
        await runtime.client.ping()
        return jsonify({"status": "ok"})

    app.register_blueprint(jobs_api.blueprint)
    app.register_blueprint(calendar_api.blueprint)
    app.register_blueprint(calendar_api.admin_blueprint)
    app.register_blueprint(admin_api.blueprint)
    app.register_blueprint(metrics_api.blueprint)
    app.register_blueprint(dashboard.blueprint)
    register_error_handlers(app)
    return app


def _build_runtime(app: Quart, settings: AppSettings) -> AppRuntime:
    holder: list[AppRuntime] = []

    async def worker_started(agent: Agent) -> None:
        await holder[0].worker_started(agent)

    async def worker_stopped(agent: Agent) -> None:
        await holder[0].worker_stopped(agent)

    @asynccontextmanager
    async def job_context() -> AsyncIterator[None]:
        # Every job a worker runs is wrapped in the app context: current_app, config and the engine.
        async with app.app_context():
            yield

    agent = Agent(
        settings.agent,
        job_context=job_context,
        on_worker_startup=(worker_started,),
        on_worker_shutdown=(worker_stopped,),
    )
    signer = (
        TokenSigner(settings.secret_key, max_age_s=settings.token_max_age_s) if settings.secret_key else None
    )
    runtime = AppRuntime(
        settings=settings,
        agent=agent,
        client=ClientAgent(agent),
        serializer=JobStateSerializerDict(agent.registry, resources=agent.resources),
        signer=signer,
    )
    holder.append(runtime)
    return runtime
