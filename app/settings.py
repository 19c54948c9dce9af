"""AppSettings: the reference application's own knobs (secret, body limit, bind address) plus AgentSettings."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from agent_async import AgentSettings, ConfigurationError

__all__ = ["APP_JOB_PACKAGES", "AppSettings"]

MIN_SECRET_CHARS = 16
DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024
DEFAULT_TOKEN_MAX_AGE_S = 12 * 3600
# External calendars (app/module/calendar/fetch.py and the sync job): what one fetch may take, and
# the ConnectionGuard of every `ics:<host>` connection (shared through Redis by all workers).
DEFAULT_FETCH_TIMEOUT_S = 10.0
DEFAULT_FETCH_MAX_BYTES = 5 * 1024 * 1024
DEFAULT_ICS_MIN_INTERVAL_S = 1.0
DEFAULT_ICS_FAILURE_THRESHOLD = 5
DEFAULT_ICS_COOLDOWN_S = 60.0
# Syncs of one periodic sweep running at the same time (the group's window), across all workers.
DEFAULT_ICS_SWEEP_MAX_IN_FLIGHT = 10
# The operator dashboard (/admin/ui): how long a sign-in token minted by `python -m app dashboard-token`
# may wait before it is exchanged, and how long the session cookie it is exchanged for lasts.
DEFAULT_DASHBOARD_TOKEN_MAX_AGE_S = 15 * 60
DEFAULT_DASHBOARD_SESSION_MAX_AGE_S = 8 * 3600
# Where the app's job modules live (app/module/<module>/jobs/*.py). The library's own default is
# empty (it names no application); the app fills it in unless AGENT_JOB_PACKAGES names others.
APP_JOB_PACKAGES = ("app.module",)


@dataclass(frozen=True, slots=True)
class AppSettings:
    """Settings of the API and worker processes; `from_env` reads AGENT_* variables and validates them.

    The secret key is only required by processes that sign or check tokens (API, `token`); the
    worker never sees a token, so it may run without one.
    """

    # An empty job_packages (the library's default) means the app's own: APP_JOB_PACKAGES.
    agent: AgentSettings = field(default_factory=AgentSettings)
    secret_key: str | None = field(default=None, repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    token_max_age_s: int = DEFAULT_TOKEN_MAX_AGE_S
    host: str = "127.0.0.1"
    port: int = 8000
    # Host names or IP addresses an external calendar may reach although they are not public
    # (loopback, private, link-local...); empty: only public addresses.
    fetch_allow_hosts: tuple[str, ...] = ()
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    ics_min_interval_s: float = DEFAULT_ICS_MIN_INTERVAL_S
    ics_failure_threshold: int = DEFAULT_ICS_FAILURE_THRESHOLD
    ics_cooldown_s: float = DEFAULT_ICS_COOLDOWN_S
    ics_sweep_max_in_flight: int = DEFAULT_ICS_SWEEP_MAX_IN_FLIGHT
    # The bearer token of GET /metrics (app/api/metrics.py); None: the endpoint answers 404.
    metrics_token: str | None = field(default=None, repr=False)
    dashboard_token_max_age_s: int = DEFAULT_DASHBOARD_TOKEN_MAX_AGE_S
    dashboard_session_max_age_s: int = DEFAULT_DASHBOARD_SESSION_MAX_AGE_S
    # Once the API serves, the objects then alive leave Python's collector (gc.freeze): a full
    # collection stops stalling every request in flight. Off by default for the reason the
    # worker's is (AgentSettings.worker_gc_freeze): process-wide, for a process that only serves.
    api_gc_freeze: bool = False

    ENV = {
        "secret_key": "AGENT_SECRET_KEY",
        "max_body_bytes": "AGENT_MAX_BODY_BYTES",
        "token_max_age_s": "AGENT_TOKEN_MAX_AGE_SECONDS",
        "host": "AGENT_HOST",
        "port": "AGENT_PORT",
        "fetch_allow_hosts": "AGENT_FETCH_ALLOW_HOSTS",
        "fetch_timeout_s": "AGENT_FETCH_TIMEOUT_SECONDS",
        "fetch_max_bytes": "AGENT_FETCH_MAX_BYTES",
        "ics_min_interval_s": "AGENT_ICS_MIN_INTERVAL_SECONDS",
        "ics_failure_threshold": "AGENT_ICS_FAILURE_THRESHOLD",
        "ics_cooldown_s": "AGENT_ICS_COOLDOWN_SECONDS",
        "ics_sweep_max_in_flight": "AGENT_ICS_SWEEP_MAX_IN_FLIGHT",
        "metrics_token": "AGENT_METRICS_TOKEN",
        "dashboard_token_max_age_s": "AGENT_DASHBOARD_TOKEN_MAX_AGE_SECONDS",
        "dashboard_session_max_age_s": "AGENT_DASHBOARD_SESSION_MAX_AGE_SECONDS",
        "api_gc_freeze": "AGENT_API_GC_FREEZE",
    }

    def __post_init__(self) -> None:
        if not self.agent.job_packages:
            object.__setattr__(self, "agent", replace(self.agent, job_packages=APP_JOB_PACKAGES))
        if self.secret_key is not None and len(self.secret_key) < MIN_SECRET_CHARS:
            # Never echo the value: it is a secret even when it is a bad one.
            raise ConfigurationError(
                f"invalid setting AGENT_SECRET_KEY: must be at least {MIN_SECRET_CHARS} characters "
                "(generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if self.metrics_token is not None and len(self.metrics_token) < MIN_SECRET_CHARS:
            # A scrape token guards the figures of every job: as long as the secret key, never echoed.
            raise ConfigurationError(
                f"invalid setting AGENT_METRICS_TOKEN: must be at least {MIN_SECRET_CHARS} characters, or unset "
                "to turn GET /metrics off"
            )
        self._check_ranges()
        if not 0 <= self.port <= 65535:
            raise ConfigurationError(f"invalid setting AGENT_PORT={self.port}: must be 0..65535")
        object.__setattr__(
            self, "fetch_allow_hosts", tuple(h.strip().lower() for h in self.fetch_allow_hosts if h.strip())
        )
        for name, value, positive in (
            ("fetch_timeout_s", self.fetch_timeout_s, True),
            ("ics_min_interval_s", self.ics_min_interval_s, False),
            ("ics_cooldown_s", self.ics_cooldown_s, False),
        ):
            if not math.isfinite(value) or value < 0 or (positive and value == 0):
                kind = "positive" if positive else "non-negative"
                raise ConfigurationError(
                    f"invalid setting {self.ENV[name]}={value}: must be a {kind} number of seconds"
                )
        if not 1 <= self.ics_sweep_max_in_flight <= 1000:
            raise ConfigurationError(
                f"invalid setting AGENT_ICS_SWEEP_MAX_IN_FLIGHT={self.ics_sweep_max_in_flight}: must be 1 to 1000"
            )

    def _check_ranges(self) -> None:
        """The integer settings with a least value (named by their variable, value echoed: none is a secret)."""
        for name, least in (
            ("max_body_bytes", 1024), ("fetch_max_bytes", 1024), ("token_max_age_s", 1),
            ("dashboard_token_max_age_s", 1), ("dashboard_session_max_age_s", 1), ("ics_failure_threshold", 1),
        ):
            value = getattr(self, name)
            if value < least:
                raise ConfigurationError(f"invalid setting {self.ENV[name]}={value}: must be >= {least}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AppSettings:
        """Read AGENT_* variables (unset ones keep their defaults)."""
        env = os.environ if environ is None else environ
        agent = AgentSettings.from_env(env)
        secret = env.get(cls.ENV["secret_key"]) or None
        return cls(
            agent=agent,
            secret_key=secret,
            max_body_bytes=_int(env, cls.ENV["max_body_bytes"], DEFAULT_MAX_BODY_BYTES),
            token_max_age_s=_int(env, cls.ENV["token_max_age_s"], DEFAULT_TOKEN_MAX_AGE_S),
            host=env.get(cls.ENV["host"], "127.0.0.1"),
            port=_int(env, cls.ENV["port"], 8000),
            fetch_allow_hosts=tuple(env.get(cls.ENV["fetch_allow_hosts"], "").split(",")),
            fetch_timeout_s=_float(env, cls.ENV["fetch_timeout_s"], DEFAULT_FETCH_TIMEOUT_S),
            fetch_max_bytes=_int(env, cls.ENV["fetch_max_bytes"], DEFAULT_FETCH_MAX_BYTES),
            ics_min_interval_s=_float(env, cls.ENV["ics_min_interval_s"], DEFAULT_ICS_MIN_INTERVAL_S),
            ics_failure_threshold=_int(env, cls.ENV["ics_failure_threshold"], DEFAULT_ICS_FAILURE_THRESHOLD),
            ics_cooldown_s=_float(env, cls.ENV["ics_cooldown_s"], DEFAULT_ICS_COOLDOWN_S),
            ics_sweep_max_in_flight=_int(
                env, cls.ENV["ics_sweep_max_in_flight"], DEFAULT_ICS_SWEEP_MAX_IN_FLIGHT
            ),
            metrics_token=(env.get(cls.ENV["metrics_token"]) or "").strip() or None,
            dashboard_token_max_age_s=_int(
                env, cls.ENV["dashboard_token_max_age_s"], DEFAULT_DASHBOARD_TOKEN_MAX_AGE_S
            ),
            dashboard_session_max_age_s=_int(
                env, cls.ENV["dashboard_session_max_age_s"], DEFAULT_DASHBOARD_SESSION_MAX_AGE_S
            ),
            api_gc_freeze=_bool(env, cls.ENV["api_gc_freeze"], False),
        )

    def require_secret(self) -> str:
        """The secret key, or a ConfigurationError telling how to set one."""
        if self.secret_key is None:
            raise ConfigurationError(
                "AGENT_SECRET_KEY is not set: the API signs and checks bearer tokens with it. Set it to a "
                "random string of at least 16 characters, e.g. "
                "export AGENT_SECRET_KEY=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return self.secret_key

    def with_agent(self, agent: AgentSettings) -> AppSettings:
        return replace(self, agent=agent)


def _int(env: Mapping[str, str], var: str, default: int) -> int:
    raw = env.get(var)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigurationError(f"invalid setting {var}={raw!r}: expected an integer") from None


def _float(env: Mapping[str, str], var: str, default: float) -> float:
    raw = env.get(var)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw.strip())
    except ValueError:
        raise ConfigurationError(f"invalid setting {var}={raw!r}: expected a number") from None


def _bool(env: Mapping[str, str], var: str, default: bool) -> bool:
    raw = env.get(var)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"invalid setting {var}={raw!r}: expected true or false")
