"""The reference form and the text/charset helpers, without a database."""

from __future__ import annotations

import pytest

from agent_async.storage import ClientStorage
from agent_async.storage.reference import key_of, new_key, reference_of
from agent_async.storage.text import charset_of, with_charset


def test_reference_round_trips_its_key() -> None:
    """reference_of/key_of are inverse; keys are 32 lowercase hex characters."""
    key = new_key()
    assert len(key) == 32 and key == key.lower()
    assert key_of(reference_of(key)) == key


@pytest.mark.parametrize(
    "value",
    [
        None,
        1,
        b"agent:file:" + b"a" * 32,
        "agent:file:" + "A" * 32,
        "agent:file:" + "a" * 31,
        "agent:file:" + "a" * 32 + " ",
        " agent:file:" + "a" * 32,
        "sogo:file:" + "a" * 32,
        "z" * 10**6,
    ],
)
def test_is_reference_rejects_anything_but_the_exact_form(value: object) -> None:
    """is_reference accepts any object and is True only for `agent:file:<32 lowercase hex>`."""
    assert ClientStorage.is_reference(value) is False
    assert key_of(value) is None


def test_with_charset_replaces_an_existing_charset_and_keeps_other_parameters() -> None:
    """The charset parameter is set once; other MIME parameters survive."""
    assert with_charset("text/calendar; method=PUBLISH; charset=latin-1", "utf-8") == (
        "text/calendar; method=PUBLISH; charset=utf-8"
    )
    assert charset_of('text/plain; CHARSET="ISO-8859-1"') == "iso-8859-1"
    assert charset_of("application/pdf") is None
