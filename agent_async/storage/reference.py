"""The one reference form of a stored blob: `agent:file:<32 lowercase hex key>`."""

from __future__ import annotations

import re
import uuid

__all__ = ["REFERENCE_PREFIX", "is_reference", "key_of", "new_key", "reference_of"]

REFERENCE_PREFIX = "agent:file:"
_REFERENCE_RE = re.compile(r"agent:file:([0-9a-f]{32})")
# A reference is exactly prefix + 32 hex; bound the length before running the regex on hostile input.
_REFERENCE_LEN = len(REFERENCE_PREFIX) + 32


def new_key() -> str:
    """A fresh random key: 128 bits, so keys never collide and cannot be guessed."""
    return uuid.uuid4().hex


def reference_of(key: str) -> str:
    """The opaque reference handed to callers for `key`."""
    return REFERENCE_PREFIX + key


def is_reference(value: object) -> bool:
    """True if `value` has the reference form; accepts any object and never raises."""
    return (
        isinstance(value, str)
        and len(value) == _REFERENCE_LEN
        and _REFERENCE_RE.fullmatch(value) is not None
    )


def key_of(value: object) -> str | None:
    """The key inside a well-formed reference, or None for anything else."""
    if not is_reference(value):
        return None
    return str(value)[len(REFERENCE_PREFIX):]
