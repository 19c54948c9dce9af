"""AppRuntime: the resources one process builds at start-up (Agent, ClientAgent, SQL engine) and closes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from quart import current_app
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_async import Agent, AgentError, ClientAgent, ConnectionGuard, GuardConfig
from agent_async.serializer import JobStateSerializerDict
from app.auth import TokenSigner
from app.db import create_app_engine
from app.settings import AppSettings

__all__ = ["EXTENSION_KEY", "AppRuntime", "current_runtime"]

logger = logging.getLogger(__name__)

EXTENSION_KEY = "agent_async_app"


@dataclass
class AppRuntime:
    """Built by create_app (opens nothing); the API opens it while serving, a worker through its hooks."""

    settings: AppSettings
    agent: Agent
    client: ClientAgent
    serializer: JobStateSerializerDict
    signer: TokenSigner | None
    _engine: AsyncEngine | None = field(default=None, repr=False)
    # True when a worker hook built the engine (and must dispose of it), not the API.
    _worker_owns_engine: bool = field(default=False, repr=False)
    _ics_guard: ConnectionGuard | None = field(default=None, repr=False)

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise AgentError("the application database is not open: serve the app or start a worker")
        return self._engine

    @property
    def ics_guard(self) -> ConnectionGuard:
        """The ConnectionGuard of every `ics:<host>` connection (external calendars), one per process,
        built on first use from the AGENT_ICS_* settings; its state is shared by all workers in Redis."""
        if self._ics_guard is None:
            settings = self.settings
            config = GuardConfig(
                min_interval_s=settings.ics_min_interval_s,
                failure_threshold=settings.ics_failure_threshold,
                cooldown_s=settings.ics_cooldown_s,
                # A trial holds its reservation for as long as one fetch may take (its deadline, plus slack).
                trial_timeout_s=max(30.0, settings.fetch_timeout_s * 3 + 5),
            )
            self._ics_guard = ConnectionGuard(
                lambda: self.agent.redis, namespace=settings.agent.namespace, configs={"ics:*": config},
                metrics=settings.agent.metrics_enabled,
            )
        return self._ics_guard

    def require_signer(self) -> TokenSigner:
        """The token signer; a ConfigurationError naming AGENT_SECRET_KEY when no secret is set."""
        if self.signer is None:
            self.signer = TokenSigner(self.settings.require_secret(), max_age_s=self.settings.token_max_age_s)
        return self.signer

    def _open_engine(self) -> bool:
        if self._engine is not None:
            return False
        self._engine = create_app_engine(self.settings.agent.database_url)
        return True

    async def _close_engine(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    async def start_serving(self) -> None:
        """API start-up: connect the agent (Redis is reached lazily) and build the SQL engine."""
        await self.agent.open()
        self._open_engine()
        logger.info("API ready (namespace %s)", self.settings.agent.namespace)

    async def stop_serving(self) -> None:
        await self.agent.close()
        await self._close_engine()

    async def worker_started(self, agent: Agent) -> None:
        """Worker start-up hook; in-process tests reuse the engine the API already built."""
        self._worker_owns_engine = self._open_engine() or self._worker_owns_engine

    async def worker_stopped(self, agent: Agent) -> None:
        if self._worker_owns_engine:
            self._worker_owns_engine = False
            await self._close_engine()
            await agent.get_large_store().close()


def current_runtime() -> AppRuntime:
    """The runtime of the current Quart app (in a request, or in a job run inside the app context)."""
    runtime: AppRuntime = current_app.extensions[EXTENSION_KEY]
    return runtime
