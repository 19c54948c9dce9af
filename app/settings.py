"""AppSettings: the reference application's own knobs (secret, body limit, bind address) plus AgentSettings."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from agent_async import AgentSettings, ConfigurationError

__all__ = ["APP_JOB_PACKAGES", "AppSettings"]

MIN_SECRET_CHARS = 16
DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024
DEFAULT_TOKEN_MAX_AGE_S = 12 * 3600
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

    ENV = {
        "secret_key": "AGENT_SECRET_KEY",
        "max_body_bytes": "AGENT_MAX_BODY_BYTES",
        "token_max_age_s": "AGENT_TOKEN_MAX_AGE_SECONDS",
        "host": "AGENT_HOST",
        "port": "AGENT_PORT",
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
        if self.max_body_bytes < 1024:
            raise ConfigurationError(f"invalid setting AGENT_MAX_BODY_BYTES={self.max_body_bytes}: must be >= 1024")
        if self.token_max_age_s < 1:
            raise ConfigurationError(
                f"invalid setting AGENT_TOKEN_MAX_AGE_SECONDS={self.token_max_age_s}: must be >= 1"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigurationError(f"invalid setting AGENT_PORT={self.port}: must be 0..65535")

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
