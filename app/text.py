"""Which characters a stored text field may hold: one rule for the API, the ICS import and the export.

PostgreSQL refuses NUL in any text column (SQLite and MariaDB store it), so NUL must be refused before
the database is reached, or one client could make the same request succeed on one backend and fail on
another. The other control characters are stored everywhere but are never meaningful in a name, a
title or an ICS value (RFC 5545 3.1 excludes them all but HTAB), so they are refused as well:

- single-line fields (calendar name, event summary, event UID): no control character at all, tab and
  line breaks included, and no U+2028/U+2029 (line and paragraph separators). A line break in a
  calendar name used to reach the ICS export unescaped and fail every export of that calendar.
- multi-line fields (event description): tab, LF and CR are allowed (a textarea sends CRLF; the ICS
  codec escapes line breaks), every other control character is refused.

Lone surrogates (which a JSON `\\ud800` escape can produce) cannot be encoded for any database either.
"""

from __future__ import annotations

import re

__all__ = ["sanitize_for_export", "single_line_problem", "text_problem"]

# Cc is exactly U+0000-U+001F and U+007F-U+009F; Cs is U+D800-U+DFFF.
_SINGLE_LINE_REFUSED = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")
_MULTI_LINE_REFUSED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")

_NAMES = {0x00: "NUL", 0x09: "tab", 0x0A: "line feed", 0x0D: "carriage return", 0x7F: "DEL",
          0x2028: "line separator", 0x2029: "paragraph separator"}


def _describe(char: str) -> str:
    code = ord(char)
    name = _NAMES.get(code)
    if 0xD800 <= code <= 0xDFFF:
        name = "lone surrogate"
    return f"U+{code:04X}" + (f" {name}" if name else "")


def text_problem(value: str, *, multiline: bool = False) -> str | None:
    """None when `value` may be stored, else a message naming the first refused character and where."""
    match = (_MULTI_LINE_REFUSED if multiline else _SINGLE_LINE_REFUSED).search(value)
    if match is None:
        return None
    allowed = "control characters other than tab and line breaks" if multiline else "control characters or line breaks"
    return f"must not contain {allowed} (found {_describe(match.group())} at position {match.start()})"


def single_line_problem(value: str) -> str | None:
    return text_problem(value, multiline=False)


def sanitize_for_export(value: str) -> str:
    """`value` without the characters no ICS value may carry (rows stored before the rule still export).

    Tab and line breaks stay: the ICS writer escapes line breaks in TEXT values.
    """
    return _MULTI_LINE_REFUSED.sub("", value)
