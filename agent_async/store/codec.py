"""JSON on the wire: everything this layer puts in Redis is JSON, so nothing read back can run code."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["check_json_safe", "dumps", "dumps_bytes", "loads", "text"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _exception_as_dict(value: object) -> object:
    if isinstance(value, BaseException):
        return {"exc_type": type(value).__name__, "message": str(value)}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# The same JSON, except that an exception becomes {exc_type, message}: the queue engine stores the
# exception of a job it dropped, and only its type and message are kept.
_ENCODER_WITH_EXCEPTIONS = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_exception_as_dict
)


def dumps(value: Any) -> str:
    """Strict JSON: raises TypeError/ValueError for anything JSON cannot carry (NaN included)."""
    return _ENCODER.encode(value)


def dumps_bytes(value: Any, *, exceptions: bool = False) -> bytes:
    """`dumps` as UTF-8 bytes; `exceptions=True` turns exceptions into {exc_type, message}."""
    return (_ENCODER_WITH_EXCEPTIONS if exceptions else _ENCODER).encode(value).encode()


def loads(raw: str | bytes) -> Any:
    return json.loads(raw)


def check_json_safe(value: Any, path: str = "payload") -> None:
    """Raise ValueError naming the first value that would not survive a JSON round trip.

    Stricter than json.dumps: tuples (they come back as lists) and non-str dict keys (they come
    back as strings) are refused so that a payload reads back exactly as it was sent.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path} is {value!r}, which JSON cannot carry")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json_safe(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{path} has a non-string key {key!r}")
            check_json_safe(item, f"{path}.{key}")
        return
    raise ValueError(f"{path} is a {type(value).__name__}, which is not JSON-safe")


def text(value: object) -> str:
    """A Redis reply or argument as text: bytes are UTF-8 (str(b"x") would give the repr "b'x'")."""
    return value.decode() if isinstance(value, bytes) else str(value)
