"""AgentSettings: every knob of the library, read once from the environment and validated."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agent_async.errors import ConfigurationError
from agent_async.logs import LogFormat

__all__ = ["AgentSettings"]

_T = TypeVar("_T")

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_STORAGE_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_URL_PASSWORD_RE = re.compile(r"(://[^:/@]*:)[^@]*@")

DAY_S = 86_400


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Settings shared by the API process and the workers.

    Each field maps to one environment variable (see `ENV`); `from_env` reads and validates them all
    and raises `ConfigurationError` naming the first bad one.
    """

    # Not in repr: a URL may carry a password, and settings end up in logs.
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)
    # Prefix of every Redis key this layer writes and of the arq queue name.
    namespace: str = "agent"
    # How long a finished JobState stays readable.
    state_retention_s: int = 7 * DAY_S
    # 5 ms keeps an idle worker's start latency under 10 ms for about 200 cheap ZRANGEBYSCOREs/s.
    poll_delay_s: float = 0.005
    worker_max_jobs: int = 10
    # Retry backoff: base * 2**(attempt-1), capped, with full jitter in [0.5, 1.0] of that.
    retry_backoff_base_s: float = 1.0
    retry_backoff_max_s: float = 300.0
    # Extra time after the soft limit before a run is stopped hard.
    hard_timeout_grace_s: float = 10.0
    # After a cancel request: time a running job gets to stop on its own before it is stopped hard.
    cancel_grace_s: float = 5.0
    # An enqueue (ClientAgent.enqueue, enqueue_many, a schedule's fire) is sent again with backoff for
    # this long while Redis is unreachable, so that a short outage (a restart) costs the caller a
    # wait instead of an error. A send whose reply was lost is recognised by the next one: the job
    # is queued once. 0: one send, and the error at once.
    enqueue_resend_s: float = 2.0
    # A running job's lease; a worker renews it every third of it. A dead worker's jobs are
    # noticed within lease + reconcile interval, whatever arq's timeouts are.
    lease_s: float = 30.0
    # On SIGTERM: stop taking jobs, give running ones this long, then hand them back.
    shutdown_drain_s: float = 30.0
    # How often a worker looks for states that arq dropped without calling a hook.
    reconcile_interval_s: float = 5.0
    # A file a worker touches at every heartbeat (a third of the lease), whatever Redis says: its
    # age is the liveness of that one worker process (`python -m agent_async healthcheck`).
    # Empty: none is written.
    worker_heartbeat_file: str = ""
    # Append every transition and progress update to the namespace's event stream (ClientAgent.events).
    # Off saves Redis about 3 stream writes per job; nothing else depends on the stream.
    events_enabled: bool = True
    # Count jobs, retries, durations... in the namespace's metrics hash, inside the transitions'
    # own scripts (agent_async.metrics; no extra round trip).
    metrics_enabled: bool = True
    # Packages scanned by init_jobs(): <root>/<module>/jobs/*.py. None by default: the application names its own.
    job_packages: tuple[str, ...] = ()
    # Time zone in which schedules' crons are read.
    schedule_timezone: str = "UTC"
    # When not empty, only these schedules run; the others are reported as disabled.
    schedule_allowlist: tuple[str, ...] = ()
    storage_type: str = "database"
    database_url: str = field(default="sqlite+aiosqlite:///data/agent.db", repr=False)
    storage_chunk_bytes: int = 1024 * 1024
    large_store_max_age_s: int = 7 * DAY_S
    # A run record still `running` whose heartbeat is older than this is ended as "stale: worker
    # lost" (agent_async.runs): far above the pause between two heartbeats of any job, since a live
    # run marked stale can no longer record its own outcome.
    run_stale_after_s: float = 2700.0
    # How log lines are rendered (agent_async.logs): `console` for people, `json` for collectors.
    log_format: LogFormat = LogFormat.CONSOLE
    # Push wake-up (fast worker only; arq's stock Worker keeps polling every poll_delay): an idle
    # worker blocks in Redis until a job is queued, instead of polling. Off: the fast worker polls.
    worker_push_wakeup: bool = True
    # Longest such block: the pause after which an idle worker looks at the queue anyway (a job
    # that arq itself gives back when its in-progress key expires signals nobody).
    worker_max_block_s: float = 10.0
    # Group commit (fast worker only): the runs that end together are finished (each outcome with
    # arq's finish of its job) in one script call (agent_async.engine.finish). Off: one per run.
    worker_coalesce: bool = True
    # With group commit: how long (ms) a finish call of a busy worker may wait for the runs still
    # holding slots to end and join it (0: it goes as soon as no call is in flight). Calls of 10 runs
    # instead of about 3 cost Redis a fifth fewer commands and CPU per job (more jobs/s from one
    # Redis shared by many workers) and a worker of no-op jobs about a tenth of its own rate; an
    # outcome is written up to this much later. A run alone in its worker never waits.
    worker_finish_linger_ms: float = 2.0
    # After start-up, a worker moves every object then alive out of Python's collector (gc.freeze):
    # full collections stop stalling its event loop. Off by default: it is process-wide, and an
    # object frozen then freed later is never reclaimed. For a process that only runs the worker.
    worker_gc_freeze: bool = False

    ENV = {
        "redis_url": "AGENT_REDIS_URL",
        "namespace": "AGENT_NAMESPACE",
        "state_retention_s": "AGENT_STATE_RETENTION_SECONDS",
        "poll_delay_s": "AGENT_POLL_DELAY_SECONDS",
        "worker_max_jobs": "AGENT_WORKER_MAX_JOBS",
        "retry_backoff_base_s": "AGENT_RETRY_BACKOFF_SECONDS",
        "retry_backoff_max_s": "AGENT_RETRY_BACKOFF_MAX_SECONDS",
        "hard_timeout_grace_s": "AGENT_HARD_TIMEOUT_GRACE_SECONDS",
        "cancel_grace_s": "AGENT_CANCEL_GRACE_SECONDS",
        "enqueue_resend_s": "AGENT_ENQUEUE_RESEND_SECONDS",
        "lease_s": "AGENT_LEASE_SECONDS",
        "shutdown_drain_s": "AGENT_SHUTDOWN_DRAIN_SECONDS",
        "reconcile_interval_s": "AGENT_RECONCILE_INTERVAL_SECONDS",
        "worker_heartbeat_file": "AGENT_WORKER_HEARTBEAT_FILE",
        "events_enabled": "AGENT_EVENTS_ENABLED",
        "metrics_enabled": "AGENT_METRICS_ENABLED",
        "job_packages": "AGENT_JOB_PACKAGES",
        "schedule_timezone": "AGENT_SCHEDULE_TIMEZONE",
        "schedule_allowlist": "AGENT_SCHEDULE_ALLOWLIST",
        "storage_type": "AGENT_STORAGE_TYPE",
        "database_url": "AGENT_DATABASE_URL",
        "storage_chunk_bytes": "AGENT_STORAGE_CHUNK_BYTES",
        "large_store_max_age_s": "AGENT_LARGE_STORE_MAX_AGE_SECONDS",
        "run_stale_after_s": "AGENT_RUN_STALE_SECONDS",
        "log_format": "AGENT_LOG_FORMAT",
        "worker_push_wakeup": "AGENT_WORKER_PUSH_WAKEUP",
        "worker_max_block_s": "AGENT_WORKER_MAX_BLOCK_SECONDS",
        "worker_coalesce": "AGENT_WORKER_COALESCE",
        "worker_finish_linger_ms": "AGENT_WORKER_FINISH_LINGER_MS",
        "worker_gc_freeze": "AGENT_WORKER_GC_FREEZE",
    }

    def __post_init__(self) -> None:
        self._check(_NAMESPACE_RE.match(self.namespace) is not None, "namespace",
                    "use 1-64 letters, digits, '_', '.' or '-'")
        self._check(self.redis_url.startswith(("redis://", "rediss://", "unix://")), "redis_url",
                    "expected redis://host:port/db, rediss://... or unix://path")
        self._check(self.state_retention_s > 0, "state_retention_s", "must be > 0")
        self._check(0 <= self.poll_delay_s <= 60, "poll_delay_s", "must be between 0 and 60")
        self._check(self.worker_max_jobs >= 1, "worker_max_jobs", "must be >= 1")
        self._check(self.retry_backoff_base_s >= 0, "retry_backoff_base_s", "must be >= 0")
        self._check(self.retry_backoff_max_s >= self.retry_backoff_base_s, "retry_backoff_max_s",
                    "must be >= the backoff base")
        self._check(self.hard_timeout_grace_s >= 0, "hard_timeout_grace_s", "must be >= 0")
        self._check(self.reconcile_interval_s > 0, "reconcile_interval_s", "must be > 0")
        self._check(self.cancel_grace_s >= 0, "cancel_grace_s", "must be >= 0")
        self._check(0 <= self.enqueue_resend_s <= 60, "enqueue_resend_s", "must be between 0 and 60")
        self._check(self.lease_s >= 0.3, "lease_s", "must be >= 0.3")
        self._check(self.shutdown_drain_s >= 0, "shutdown_drain_s", "must be >= 0")
        self._check(all(p for p in self.job_packages), "job_packages", "empty package name")
        self._check(_is_timezone(self.schedule_timezone), "schedule_timezone",
                    "expected an IANA time zone such as UTC or Europe/Paris")
        self._check(_STORAGE_TYPE_RE.match(self.storage_type) is not None, "storage_type",
                    "expected a lower-case backend name such as 'database'")
        self._check("://" in self.database_url, "database_url",
                    "expected an SQLAlchemy URL such as postgresql+asyncpg://user@host/db")
        self._check(self.storage_chunk_bytes >= 1024, "storage_chunk_bytes", "must be >= 1024")
        self._check(self.large_store_max_age_s > 0, "large_store_max_age_s", "must be > 0")
        self._check(self.run_stale_after_s > 0, "run_stale_after_s", "must be > 0")
        self._check(isinstance(self.log_format, LogFormat), "log_format",
                    f"expected a LogFormat member ({_choices(LogFormat)})")
        self._check(0.01 <= self.worker_max_block_s <= 300, "worker_max_block_s", "must be between 0.01 and 300")
        self._check(0 <= self.worker_finish_linger_ms <= 100, "worker_finish_linger_ms", "must be between 0 and 100")

    def _check(self, ok: bool, name: str, why: str) -> None:
        if not ok:
            shown = _redact(str(getattr(self, name)))
            raise ConfigurationError(f"invalid setting {self.ENV.get(name, name)}={shown!r}: {why}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> AgentSettings:
        """Read every AGENT_* variable; unset ones keep their defaults; `overrides` win over both."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        defaults = cls()
        for f in fields(cls):
            var = cls.ENV.get(f.name)
            if var is None or var not in env:
                continue
            values[f.name] = _parse(var, env[var], type(getattr(defaults, f.name)))
        values.update(overrides)
        return cls(**values)

    def with_namespace(self, namespace: str) -> AgentSettings:
        """A copy under another key prefix (tests, second deployment on one Redis)."""
        return replace(self, namespace=namespace)


def _is_timezone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _redact(value: str) -> str:
    """Hide the password of a URL: settings errors end up in logs."""
    return _URL_PASSWORD_RE.sub(r"\1***@", value)


def _parse_bool(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _choices(kind: type[Enum]) -> str:
    return ", ".join(str(member.value) for member in kind)


def _parse(var: str, raw: str, kind: type[_T]) -> Any:
    if issubclass(kind, Enum):
        try:
            return kind(raw.strip().lower())
        except ValueError:
            why = f"expected one of {_choices(kind)}"
            raise ConfigurationError(f"invalid setting {var}={_redact(raw)!r}: {why}") from None
    parsers: dict[type, Callable[[str], Any]] = {
        bool: _parse_bool,
        int: int,
        float: float,
        str: str,
        tuple: lambda s: tuple(p.strip() for p in s.split(",") if p.strip()),
    }
    try:
        return parsers[kind](raw.strip())
    except (ValueError, KeyError):
        raise ConfigurationError(f"invalid setting {var}={_redact(raw)!r}: expected {kind.__name__}") from None
