"""Structured logs: structlog over the standard library, one formatter for every logger of the process.

`configure_logging` puts one `structlog.stdlib.ProcessorFormatter` on a root handler, so lines from
stdlib loggers (the library's own `logging.getLogger`, arq's `arq.worker`, hypercorn's) and from
structlog loggers render the same way, as JSON or for a console. The fields bound with `job_fields`
(the worker binds them around each run) appear on every line logged inside that run, stdlib
`logger.info` calls from a job's `process()` included. A redaction step masks secrets last.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = [
    "ARQ_CLI_LOG_CONFIG",
    "DICT_CONFIG_FROM_ENV",
    "JOB_FIELDS",
    "EngineJobLineFilter",
    "LogFormat",
    "LogSetup",
    "bound_fields",
    "configure_logging",
    "current_setup",
    "handler_from_env",
    "job_fields",
    "logging_handler",
    "redact",
    "reset_logging",
    "silence_engine_job_lines",
]


class LogFormat(StrEnum):
    """How lines are rendered (AGENT_LOG_FORMAT)."""

    CONSOLE = "console"
    JSON = "json"


# The fields every line inside a job run carries (bound by the worker around each run).
JOB_FIELDS = ("job_id", "job", "user_uid", "attempt")

# `arq app.worker.WorkerSettings --custom-log-dict agent_async.logs.ARQ_CLI_LOG_CONFIG`: arq's CLI
# otherwise applies its own dictConfig after importing the settings, adding a second handler (its
# own plain format) to the `arq` logger, so each arq line would be printed twice. An incremental
# config changes nothing: what configure_logging set up stays.
ARQ_CLI_LOG_CONFIG: dict[str, Any] = {"version": 1, "incremental": True}

# A key whose value is masked, wherever it appears in a line (searched in the lower-cased key).
_SECRET_KEY_RE = re.compile(r"pass(word|wd)?|secret|token|authori[sz]ation|cookie|api[_-]?key|credential|private")
# The password of a URL (scheme://user:password@host), as settings._URL_PASSWORD_RE.
_URL_PASSWORD_RE = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
# An HTTP credential written out in a message: "Bearer <token>", "Basic <base64>".
_HTTP_CREDENTIAL_RE = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
_MASK = "***"
# Keys structlog and our chain set themselves: never secrets, not worth the regex.
_OWN_KEYS = frozenset({"event", "level", "logger", "timestamp", *JOB_FIELDS})

# arq's per-job INFO lines ("→ id:func(args...)", "← id:func ● result", retries, aborts): the
# start line prints the job's arguments, our wire payload (user data), the end line a result repr.
# The worker writes its own `job started` / `job finished` lines instead. All of them, and only
# them, begin with arq's elapsed-time field; arq's warnings and errors (no arguments) are kept.
_ENGINE_LOGGER = "arq.worker"
_ENGINE_JOB_LINE_PREFIX = "%6.2fs "
# The handler arq's CLI puts on its `arq` logger (arq.logs.default_log_config).
_ENGINE_CLI_LOGGER = "arq"
_ENGINE_CLI_HANDLER = "arq.standard"


class EngineJobLineFilter(logging.Filter):
    """Drops the queue engine's per-job INFO lines (see `_ENGINE_JOB_LINE_PREFIX`); installed on
    arq's worker logger by `configure_logging`, and by every worker at start-up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.levelno <= logging.INFO
            and isinstance(record.msg, str)
            and record.msg.startswith(_ENGINE_JOB_LINE_PREFIX)
        )


def silence_engine_job_lines() -> None:
    """Install EngineJobLineFilter on arq's worker logger (once, however often it is called).

    Called by every worker at start-up; there it also removes the handler arq's CLI adds (see
    ARQ_CLI_LOG_CONFIG) once configure_logging ran in this process, so that from then on each arq
    line is written once, by our handler (arq's first two lines, before start-up, still twice).
    """
    engine_logger = logging.getLogger(_ENGINE_LOGGER)
    if not any(isinstance(f, EngineJobLineFilter) for f in engine_logger.filters):
        engine_logger.addFilter(EngineJobLineFilter())
    if _current is not None:
        cli_logger = logging.getLogger(_ENGINE_CLI_LOGGER)
        for handler in [h for h in cli_logger.handlers if h.get_name() == _ENGINE_CLI_HANDLER]:
            cli_logger.removeHandler(handler)


# The run's fields (job_fields), all in one ContextVar set once per run: structlog's
# bound_contextvars sets one per key and copies the whole context to keep the previous values,
# about 50 µs per job on the worker's hot path. _merge_job_fields adds them to every line.
_JOB_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("agent_async_job_fields", default=None)


@contextmanager
def job_fields(*, job_id: str, job: str, user_uid: str | None, attempt: int) -> Iterator[None]:
    """Bind the run's fields for the block: every line logged in it (and in the tasks it creates)
    carries them."""
    token = _JOB_FIELDS.set({"job_id": job_id, "job": job, "user_uid": user_uid, "attempt": attempt})
    try:
        yield
    finally:
        _JOB_FIELDS.reset(token)


def bound_fields() -> dict[str, Any]:
    """Every field bound here now: structlog's context variables and the run's (job_fields)."""
    return {**structlog.contextvars.get_contextvars(), **(_JOB_FIELDS.get() or {})}


def _merge_job_fields(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    fields = _JOB_FIELDS.get()
    if fields is not None:
        for key, value in fields.items():
            event_dict.setdefault(key, value)  # a field given on the line itself wins
    return event_dict


def _mask_text(text: str) -> str:
    if "://" in text:
        text = _URL_PASSWORD_RE.sub(rf"\1{_MASK}@", text)
    lowered = text.lower()
    if "bearer" in lowered or "basic" in lowered:
        text = _HTTP_CREDENTIAL_RE.sub(rf"\1 {_MASK}", text)
    return text


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return _mask_text(value)
    if isinstance(value, Mapping):
        return {k: _MASK if _secret_key(k) else _redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    return value


def _secret_key(key: object) -> bool:
    return isinstance(key, str) and _SECRET_KEY_RE.search(key.lower()) is not None


def redact(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """structlog processor: masks the value of any key naming a secret (password, token, secret,
    authorization, cookie, api key, credential, private key; nested dicts too), the password of
    any URL (`scheme://user:***@host`) and `Bearer`/`Basic` credentials in any string, the message
    and the formatted exception included."""
    for key, value in event_dict.items():
        if key in _OWN_KEYS:
            if key == "event" and isinstance(value, str):
                event_dict[key] = _mask_text(value)
            continue
        event_dict[key] = _MASK if _secret_key(key) else _redact_value(value)
    return event_dict


# A LogRecord's own attributes; any other one was passed as `extra=` (our end line's fields).
# `message` and `asctime` are set on the record by any Formatter that saw it first.
_BARE_RECORD_KEYS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__)
_RECORD_KEYS = _BARE_RECORD_KEYS | {"message", "asctime"}


def _add_extra(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """structlog.stdlib.ExtraAdder, minus the attributes an earlier formatter added to the record."""
    record: logging.LogRecord | None = event_dict.get("_record")
    # Most records carry no extra: as many attributes as a bare record, nothing to look for.
    if record is not None and len(record.__dict__) > len(_BARE_RECORD_KEYS):
        for key, value in record.__dict__.items():
            if key not in _RECORD_KEYS and not key.startswith("_"):
                event_dict.setdefault(key, value)
    return event_dict


class _IsoTimestamp:
    """structlog processor: `timestamp`, ISO 8601 in UTC with microseconds, taken when the record
    was made (not when it is formatted). Cheaper than structlog's TimeStamper, a large part of a
    line's cost: the date and time are formatted once per second."""

    __slots__ = ("_cached",)

    def __init__(self) -> None:
        # (second, its formatted date and time), replaced as one tuple: safe across threads.
        self._cached: tuple[int, str] = (-1, "")

    def __call__(self, _: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        record: logging.LogRecord | None = event_dict.get("_record")
        created = record.created if record is not None else time.time()
        second = int(created)
        cached_second, prefix = self._cached
        if second != cached_second:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._cached = (second, prefix)
        event_dict["timestamp"] = f"{prefix}.{int((created - second) * 1_000_000):06d}Z"
        return event_dict


def _drop_color_message(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    # Some servers (uvicorn) add a colored duplicate of the message as an extra.
    event_dict.pop("color_message", None)
    return event_dict


@dataclass(frozen=True, slots=True)
class LogSetup:
    """What configure_logging set up in this process (a child process repeats it)."""

    log_format: LogFormat
    level: int


_current: LogSetup | None = None


def current_setup() -> LogSetup | None:
    """The setup configure_logging made in this process, or None if it was not called."""
    return _current


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler configure_logging installs (and replaces when called again)."""


def configure_logging(
    log_format: LogFormat = LogFormat.CONSOLE, *, level: int | str = logging.INFO, stream: TextIO | None = None
) -> logging.Handler:
    """Route every logger of the process through one structlog formatter on a root handler.

    Call it once at start-up (instead of `logging.basicConfig`). A second call replaces the
    handler of the first; handlers installed by others stay. Returns the installed handler.
    """
    global _current
    numeric_level = logging.getLevelName(level) if isinstance(level, str) else level
    if not isinstance(numeric_level, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging_handler(log_format, stream=stream)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    _current = LogSetup(log_format, numeric_level)
    return handler


def logging_handler(log_format: LogFormat, *, stream: TextIO | None = None) -> logging.Handler:
    """A handler rendering every record in `log_format` (structlog configured to feed it), for
    setups that attach handlers themselves; configure_logging puts one on the root logger."""
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        _merge_job_fields,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _add_extra,
        _drop_color_message,
        _IsoTimestamp(),
    ]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    out = stream if stream is not None else sys.stderr
    renderer: Processor
    if log_format is LogFormat.JSON:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_is_tty(out))
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # Exceptions as text before redaction, so a URL password in a traceback is masked too.
            structlog.processors.format_exc_info,
            redact,
            renderer,
        ],
    )
    handler = _Handler(out)
    handler.setFormatter(formatter)
    silence_engine_job_lines()
    return handler


def handler_from_env() -> logging.Handler:
    """`logging_handler` in the AGENT_LOG_FORMAT of the environment: the factory of
    DICT_CONFIG_FROM_ENV, run by dictConfig in each process (hypercorn's spawned workers too)."""
    global _current
    from agent_async.settings import AgentSettings  # settings imports this module

    log_format = AgentSettings.from_env().log_format
    _current = LogSetup(log_format, logging.INFO)
    return logging_handler(log_format)


# A logging.config.dictConfig that does what configure_logging does, from the environment: for
# servers configured by a dict (hypercorn's `logconfig_dict`, see app/hypercorn_config.py).
DICT_CONFIG_FROM_ENV: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"agent_async": {"()": "agent_async.logs.handler_from_env"}},
    "root": {"level": "INFO", "handlers": ["agent_async"]},
}


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def reset_logging() -> None:
    """Undo configure_logging (tests): remove its handler and forget its setup."""
    global _current
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    structlog.reset_defaults()
    _current = None

