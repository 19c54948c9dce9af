"""codec: strict compact JSON, exceptions as {exc_type, message} on request, and check_json_safe's refusals."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from agent_async.store import codec


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), {"a": [1, float("nan")]}])
def test_dumps_refuses_nan_and_infinity(value: Any) -> None:
    with pytest.raises(ValueError):
        codec.dumps(value)
    with pytest.raises(ValueError):
        codec.dumps_bytes(value)
    with pytest.raises(ValueError):
        codec.dumps_bytes(value, exceptions=True)


@pytest.mark.parametrize("value", [object(), {1, 2}, b"bytes", datetime.date(2024, 1, 1), {"a": {"b": object()}}])
def test_dumps_refuses_what_json_cannot_carry(value: Any) -> None:
    with pytest.raises(TypeError):
        codec.dumps(value)
    with pytest.raises(TypeError):
        codec.dumps_bytes(value)


def test_dumps_is_compact() -> None:
    assert codec.dumps({"a": [1, 2], "b": {"c": None}}) == '{"a":[1,2],"b":{"c":null}}'
    assert " " not in codec.dumps({"k": [1, {"x": True}]})


def test_dumps_keeps_non_ascii_as_is() -> None:
    text = codec.dumps({"t": "héllo — 日本語 🎉"})
    assert text == '{"t":"héllo — 日本語 🎉"}'
    assert "\\u" not in text


def test_dumps_bytes_is_utf8() -> None:
    raw = codec.dumps_bytes({"t": "zoë 🎉"})
    assert isinstance(raw, bytes)
    assert raw == '{"t":"zoë 🎉"}'.encode()
    assert raw.decode("utf-8") == codec.dumps({"t": "zoë 🎉"})


def test_loads_reads_str_and_bytes() -> None:
    value = {"a": [1, 2.5, "ü", None, True]}
    assert codec.loads(codec.dumps(value)) == value
    assert codec.loads(codec.dumps_bytes(value)) == value


def test_dumps_bytes_with_exceptions_keeps_type_and_message() -> None:
    raw = codec.dumps_bytes({"r": ValueError("bad thing"), "n": 1}, exceptions=True)
    assert json.loads(raw) == {"r": {"exc_type": "ValueError", "message": "bad thing"}, "n": 1}


def test_dumps_bytes_with_exceptions_handles_base_exceptions() -> None:
    import asyncio

    raw = codec.dumps_bytes(asyncio.CancelledError(), exceptions=True)
    assert json.loads(raw) == {"exc_type": "CancelledError", "message": ""}


def test_dumps_bytes_with_exceptions_still_refuses_other_objects() -> None:
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        codec.dumps_bytes({"r": object()}, exceptions=True)


def test_exceptions_are_refused_without_the_flag() -> None:
    with pytest.raises(TypeError):
        codec.dumps_bytes({"r": ValueError("x")})
    with pytest.raises(TypeError):
        codec.dumps(ValueError("x"))


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -3, 1.5, "ü", [], {}, {"a": [1, {"b": None}], "c": "d"}, [[[]]], {"": 1}],
)
def test_check_json_safe_accepts_json(value: Any) -> None:
    codec.check_json_safe(value)


@pytest.mark.parametrize(
    ("value", "path", "what"),
    [
        ((1, 2), "payload", "tuple"),
        ({"a": [0, (1,)]}, "payload.a[1]", "tuple"),
        ({1: "x"}, "payload", "non-string key 1"),
        ({"a": {2: "x"}}, "payload.a", "non-string key 2"),
        (float("nan"), "payload", "nan"),
        ({"a": [1, float("inf")]}, "payload.a[1]", "inf"),
        ({"s": {1, 2}}, "payload.s", "set"),
        ({"o": object()}, "payload.o", "object"),
        ({"b": b"x"}, "payload.b", "bytes"),
        ({"a": [{"b": [None, datetime.date(2024, 1, 1)]}]}, "payload.a[0].b[1]", "date"),
    ],
)
def test_check_json_safe_refuses_and_names_the_path(value: Any, path: str, what: str) -> None:
    with pytest.raises(ValueError) as caught:
        codec.check_json_safe(value)
    message = str(caught.value)
    assert message.startswith(f"{path} "), message
    assert what in message


def test_check_json_safe_uses_the_given_root_name() -> None:
    with pytest.raises(ValueError, match=r"^result\.x\[0\] is a tuple"):
        codec.check_json_safe({"x": [()]}, "result")


def test_check_json_safe_names_the_first_offender() -> None:
    with pytest.raises(ValueError, match=r"^payload\.a\[0\] "):
        codec.check_json_safe({"a": [(), set()], "b": object()})


def test_what_check_json_safe_accepts_reads_back_equal() -> None:
    value = {"a": [1, 2.0, {"b": "ü"}], "c": None, "d": False}
    codec.check_json_safe(value)
    assert codec.loads(codec.dumps(value)) == value
