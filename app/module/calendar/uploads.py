"""Reading an ICS upload at the API: raw `text/calendar` body or a multipart `file` part, decoded to text."""

from __future__ import annotations

import codecs

from quart import Request

from app.errors import ApiError

__all__ = ["FILE_FIELD", "RAW_TYPES", "read_upload"]

# Raw bodies accepted as an ICS upload; anything else must come as multipart/form-data.
RAW_TYPES = frozenset({"text/calendar", "text/plain", "application/octet-stream"})
FILE_FIELD = "file"


async def read_upload(request: Request) -> str:
    """The uploaded text; 415 for another media type, 422 when empty or not decodable."""
    if request.mimetype == "multipart/form-data":
        files = await request.files
        upload = files.get(FILE_FIELD)
        if upload is None:
            raise ApiError(422, "invalid_body", f"multipart upload without a '{FILE_FIELD}' part")
        data = upload.read()
        charset = upload.mimetype_params.get("charset")
    elif request.mimetype in RAW_TYPES:
        data = await request.get_data(as_text=False)
        charset = request.mimetype_params.get("charset")
    else:
        raise ApiError(
            415, "unsupported_media_type",
            "send the ICS file as a text/calendar body or as multipart/form-data with a 'file' part",
        )
    if not data:
        raise ApiError(422, "invalid_body", "the uploaded file is empty")
    text = _decode(data, charset)
    nul = text.find("\x00")
    if nul >= 0:
        # No iCalendar line may hold a NUL (RFC 5545 3.1), and PostgreSQL cannot store one: refused
        # here, before anything is saved. The worker checks every value again (app/text.py).
        line = text.count("\n", 0, nul) + 1
        raise ApiError(422, "invalid_body", f"the uploaded file contains a NUL character (line {line})")
    return text


def _decode(data: bytes, charset: str | None) -> str:
    name = (charset or "utf-8").lower()
    try:
        codecs.lookup(name)
    except LookupError:
        raise ApiError(422, "invalid_body", f"unknown charset {name!r}") from None
    if name in ("utf-8", "utf8"):
        name = "utf-8-sig"  # a leading BOM is not part of the calendar
    try:
        return data.decode(name)
    except UnicodeDecodeError:
        raise ApiError(
            422, "invalid_body", f"the upload is not valid {charset or 'UTF-8'} text; declare its charset"
        ) from None
