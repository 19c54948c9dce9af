"""Text <-> bytes for save_text/load_text: the charset travels in the stored content type."""

from __future__ import annotations

import codecs

from agent_async.errors import StorageError

__all__ = ["DEFAULT_CHARSET", "charset_of", "decode_text", "encode_text", "with_charset"]

DEFAULT_CHARSET = "utf-8"
# surrogateescape maps the lone surrogates U+DC80..U+DCFF back to the raw bytes 0x80..0xFF, so text that
# was decoded with errors="surrogateescape" (a non-UTF-8 upload read leniently) comes back byte-exact.
_ERRORS = "surrogateescape"


def _split(content_type: str) -> tuple[str, list[tuple[str, str]]]:
    head, *params = content_type.split(";")
    pairs: list[tuple[str, str]] = []
    for param in params:
        name, sep, value = param.partition("=")
        if sep:
            pairs.append((name.strip().lower(), value.strip().strip('"')))
    return head.strip(), pairs


def charset_of(content_type: str) -> str | None:
    """The `charset=` parameter of a MIME type, lower-cased, or None."""
    _, params = _split(content_type)
    for name, value in params:
        if name == "charset":
            return value.lower()
    return None


def with_charset(content_type: str, charset: str) -> str:
    """`content_type` with its charset parameter set to `charset` (other parameters kept)."""
    head, params = _split(content_type)
    kept = [f"{name}={value}" for name, value in params if name != "charset"]
    return "; ".join([head, *kept, f"charset={charset}"])


def encode_text(text: str, charset: str) -> bytes:
    """Encode for storage; raises LookupError for an unknown charset, UnicodeEncodeError if unencodable."""
    codecs.lookup(charset)
    return text.encode(charset, _ERRORS)


def decode_text(data: bytes, content_type: str) -> str:
    """Decode a stored blob using the charset of its content type (UTF-8 when it names none)."""
    charset = charset_of(content_type) or DEFAULT_CHARSET
    try:
        return data.decode(charset, _ERRORS)
    except LookupError:
        raise StorageError(f"cannot decode blob as text: unknown charset {charset!r}") from None
