"""StorageSource: the owner tag stamped on every stored blob."""

from __future__ import annotations

import re
from enum import StrEnum

__all__ = ["StorageSource", "source_value"]

_SOURCE_RE = re.compile(r"[a-z0-9][a-z0-9_.\-]{0,63}")


class StorageSource(StrEnum):
    """Known owners; a store instance only ever sees the rows of its own source."""

    AGENT = "agent"
    CONTACT = "contact"


def source_value(source: StorageSource | str) -> str:
    """The column value for `source`; plain strings let tests and new owners use their own tag."""
    value = source.value if isinstance(source, StorageSource) else source
    if not isinstance(value, str) or _SOURCE_RE.fullmatch(value) is None:
        raise ValueError(
            f"invalid storage source {value!r}: use 1-64 lower-case letters, digits, '_', '.' or '-'"
        )
    return value
