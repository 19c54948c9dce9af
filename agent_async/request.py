"""JobRequest: the DTO that names a job, carries its payload and declares how it runs."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar, Self

from agent_async.errors import JobDeclarationError, RequestCode, RequestRefusedError
from agent_async.registry import registry
from agent_async.schedules.cron import cron_problem
from agent_async.store import codec

__all__ = ["JobRequest"]

_JSON_SCALARS: frozenset[Any] = frozenset({str, int, float, bool, type(None), Any, object})
_JSON_CONTAINERS: frozenset[Any] = frozenset({list, dict})


@dataclasses.dataclass
class JobRequest:
    """Base of every job request. Subclass it as a dataclass and set `name`.

    ClassVars are the execution metadata (single source of truth: the Job never repeats them);
    instance fields are the payload and must be JSON types. A class that does not set `name`
    itself is an abstract base and is not registered.
    """

    name: ClassVar[str]
    soft_timeout_seconds: ClassVar[float] = 300
    max_try: ClassVar[int] = 1
    # After a worker crash: re-run (True) or fail the job (False).
    resume: ClassVar[bool] = False
    # Jobs of this name in flight per user (or globally without a user): 0 = unbounded.
    max_concurrent: ClassVar[int] = 0
    retry_for: ClassVar[tuple[type[BaseException], ...]] = ()
    cron: ClassVar[str | None] = None
    # Payload fields holding large-store references this job owns (an uploaded input, say): the
    # blobs are deleted once the job ends, whichever way it ends (success, failure, retries
    # exhausted, cancel, worker lost).
    owned_blobs: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            return
        _check_metadata(cls)
        _check_field_types(cls)
        registry.add_request(cls)

    def owned_blob_refs(self) -> list[str]:
        """The references named by `owned_blobs` that are set."""
        values = (getattr(self, field_name) for field_name in self.owned_blobs)
        return [value for value in values if isinstance(value, str) and value]

    def payload(self) -> dict[str, Any]:
        """The JSON-safe dict sent through the broker; RequestRefusedError if a value is not JSON."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        try:
            codec.check_json_safe(data)
        except ValueError as exc:
            raise RequestRefusedError(RequestCode.JOB_PAYLOAD_INVALID, f"{type(self).__name__}: {exc}") from None
        return data

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Self:
        """Rebuild a request from `payload()`; unknown keys are refused, missing ones defaulted."""
        names = _field_names(cls)
        if not payload.keys() <= names:
            unknown = sorted(set(payload) - names)
            message = f"{cls.__name__}: unknown payload fields {unknown}"
            raise RequestRefusedError(RequestCode.JOB_PAYLOAD_INVALID, message)
        try:
            return cls(**payload)
        except TypeError as exc:
            raise RequestRefusedError(RequestCode.JOB_PAYLOAD_INVALID, f"{cls.__name__}: {exc}") from None


# Read on every run of a job (the worker rebuilds its request): computed once per class.
_FIELD_NAMES: dict[type[JobRequest], frozenset[str]] = {}


def _field_names(cls: type[JobRequest]) -> frozenset[str]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names


def _check_metadata(cls: type[JobRequest]) -> None:
    problems = []
    if not isinstance(cls.name, str) or not cls.name or any(c.isspace() for c in cls.name):
        problems.append(f"name must be a non-empty string without spaces, got {cls.name!r}")
    if not isinstance(cls.max_try, int) or cls.max_try < 1:
        problems.append(f"max_try must be an int >= 1, got {cls.max_try!r}")
    if not isinstance(cls.max_concurrent, int) or cls.max_concurrent < 0:
        problems.append(f"max_concurrent must be an int >= 0, got {cls.max_concurrent!r}")
    if not isinstance(cls.soft_timeout_seconds, (int, float)) or cls.soft_timeout_seconds <= 0:
        problems.append(f"soft_timeout_seconds must be > 0, got {cls.soft_timeout_seconds!r}")
    resume: object = cls.resume  # declared bool; a subclass may assign anything
    if not isinstance(resume, bool):
        problems.append(f"resume must be a bool, got {resume!r}")
    if not isinstance(cls.retry_for, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in cls.retry_for
    ):
        problems.append(f"retry_for must be a tuple of exception classes, got {cls.retry_for!r}")
    if cls.cron is not None:
        why = cron_problem(cls.cron) if isinstance(cls.cron, str) else "not a string"
        if why is not None:
            problems.append(f"cron {cls.cron!r} is not a valid 5-field cron expression ({why})")
    if problems:
        raise JobDeclarationError(f"{cls.__module__}.{cls.__qualname__}: " + "; ".join(problems))


def _check_owned_blobs(cls: type[JobRequest], hints: dict[str, Any]) -> None:
    owned: object = cls.owned_blobs
    if not isinstance(owned, tuple) or not all(isinstance(name, str) for name in owned):
        raise JobDeclarationError(f"{cls.__module__}.{cls.__qualname__}: owned_blobs must be a tuple of field names")
    unknown = [name for name in owned if name not in hints or typing.get_origin(hints[name]) is ClassVar]
    if unknown:
        raise JobDeclarationError(
            f"{cls.__module__}.{cls.__qualname__}: owned_blobs names {unknown}, which are not payload fields"
        )


def _check_field_types(cls: type[JobRequest]) -> None:
    where = f"{cls.__module__}.{cls.__qualname__}"
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError) as exc:
        raise JobDeclarationError(f"{where}: cannot resolve field types ({exc})") from None
    for field_name, hint in hints.items():
        if typing.get_origin(hint) is ClassVar or field_name in JobRequest.__annotations__:
            continue
        if not _is_json_type(hint):
            raise JobDeclarationError(
                f"{where}: payload field {field_name!r} has type {hint!r}, which cannot be JSON "
                "(use str, int, float, bool, None, list or dict of those)"
            )
    _check_owned_blobs(cls, hints)


def _is_json_type(hint: Any) -> bool:
    if hint in _JSON_SCALARS or hint in _JSON_CONTAINERS:
        return True
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return all(_is_json_type(a) for a in args)
    if origin is list:
        return all(_is_json_type(a) for a in args)
    if origin is dict:
        return len(args) == 2 and args[0] is str and _is_json_type(args[1])
    if origin is typing.Literal:
        return all(isinstance(a, (str, int, float, bool, type(None))) for a in args)
    return False
