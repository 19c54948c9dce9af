"""ApiRequest: Quart's request with a JSON reader that answers 400 for every unreadable body.

Quart's own `get_json` decodes the body with `bytes.decode()` outside its error handling, so a body
that is not UTF-8 (or declares another charset) escaped as a UnicodeDecodeError, a 500; a deeply
nested body escaped as a RecursionError. Every endpoint reading JSON (quart-schema's
`validate_request` and the admin endpoints) goes through this method.
"""

from __future__ import annotations

from json import JSONDecodeError
from typing import Any

from quart.wrappers.request import Request

from app.errors import ApiError

__all__ = ["MAX_REQUEST_HEAD_BYTES", "ApiRequest", "request_head_bytes"]

# URL plus headers the app accepts: the usual proxy limit. hypercorn's own is higher (see
# app/hypercorn_config.py) so that the app, which can answer in JSON, is the one that refuses.
MAX_REQUEST_HEAD_BYTES = 8 * 1024

_UTF8 = frozenset({"utf-8", "utf8"})


class _UnreadableJson(ValueError):
    pass


def _json_text(raw: bytes, charset: str | None) -> str:
    # RFC 8259 8.1: JSON exchanged between systems is UTF-8, and application/json defines no charset
    # parameter. A body declared in another charset is only accepted when it is plain ASCII (which
    # every such charset shares with UTF-8): anything else would be misread, so it is refused.
    declared = (charset or "utf-8").strip().strip('"').lower()
    if declared not in _UTF8 and not raw.isascii():
        raise _UnreadableJson(
            f"the JSON body declares charset {declared!r}: JSON must be sent as UTF-8 (RFC 8259)"
        )
    try:
        return raw.decode("utf-8-sig")  # a leading BOM is tolerated (RFC 8259 allows ignoring it)
    except UnicodeDecodeError as exc:
        raise _UnreadableJson(f"the JSON body is not valid UTF-8 (invalid byte at offset {exc.start})") from None


class ApiRequest(Request):
    async def get_json(self, force: bool = False, silent: bool = False, cache: bool = True) -> Any:
        if cache and self._cached_json[silent] is not Ellipsis:
            return self._cached_json[silent]
        if not (force or self.is_json):
            return None
        raw = await self.get_data(cache=cache, as_text=False)
        assert isinstance(raw, bytes)
        try:
            result = self.json_module.loads(_json_text(raw, self.mimetype_params.get("charset")))
        except (ValueError, RecursionError) as error:  # JSONDecodeError is a ValueError
            result = None if silent else self.on_json_loading_failed(error)
        if cache:
            self._cached_json[silent] = result
        return result

    def on_json_loading_failed(self, error: Exception) -> Any:
        if isinstance(error, _UnreadableJson):
            message = str(error)
        elif isinstance(error, RecursionError):
            message = "the body is not parseable JSON: it is nested too deeply"
        elif isinstance(error, JSONDecodeError):
            message = f"the body is not parseable JSON: {error}"
        else:  # int() refusing a number of more than 4300 digits
            message = "the body is not parseable JSON: a number in it is too long"
        raise ApiError(400, "bad_request", message)


def request_head_bytes(scope: Any) -> int:
    """About the size of the HTTP request head: request line and header lines, as sent."""
    size = len(scope.get("method", "")) + len(scope.get("raw_path") or scope.get("path", "").encode())
    size += len(scope.get("query_string") or b"") + 12  # "?", spaces, " HTTP/1.1\r\n"
    for name, value in scope.get("headers") or ():
        size += len(name) + len(value) + 4  # ": " and CRLF
    return size
