"""The JobState hash: state_to_hash / state_from_hash round trip; JSON stored as strings; optional fields absent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from agent_async import JobStatus
from agent_async.state import JobState
from agent_async.store import KeySpace
from agent_async.store.schema import state_from_hash, state_to_hash

OPTIONAL_FIELDS = {"user", "schedule", "error", "result", "started_ms", "finished_ms"}


def as_redis(fields: dict[str, str]) -> dict[bytes, bytes]:
    """What HGETALL gives back for the hash `fields`."""
    return {k.encode(): v.encode() for k, v in fields.items()}


def full_state() -> JobState:
    return JobState(
        job_id="0123456789abcdef",
        name="test_store_schema.full",
        user_uid="ann",
        status=JobStatus.SUCCESS,
        payload={"text": "hi", "numbers": [1, 2, 3], "nested": {"ok": True, "none": None, "f": 1.5}},
        result={"sum": 6, "items": ["a", "b"]},
        error="RuntimeError: earlier attempt failed",
        attempts=2,
        schedule_name="nightly",
        created_ms=1_700_000_000_000,
        started_ms=1_700_000_000_100,
        finished_ms=1_700_000_000_900,
    )


def bare_state() -> JobState:
    return JobState(job_id="j-bare", name="test_store_schema.bare", created_ms=1_700_000_000_000)


def test_round_trip_with_every_optional_field() -> None:
    state = full_state()
    assert state_from_hash(as_redis(state_to_hash(state, resume=True, max_try=3)), state.job_id) == state


def test_round_trip_with_no_optional_field() -> None:
    state = bare_state()
    fields = state_to_hash(state, resume=False, max_try=1)
    assert state_from_hash(as_redis(fields), state.job_id) == state
    back = state_from_hash(as_redis(fields), state.job_id)
    assert back.user_uid is None and back.result is None and back.error is None
    assert back.schedule_name is None and back.started_ms is None and back.finished_ms is None
    assert back.status is JobStatus.PENDING and back.payload == {} and back.attempts == 0


def test_absent_optional_fields_are_absent_from_the_hash() -> None:
    fields = state_to_hash(bare_state(), resume=False, max_try=1)
    assert OPTIONAL_FIELDS.isdisjoint(fields), sorted(OPTIONAL_FIELDS & set(fields))
    assert "" not in fields.values()
    assert set(fields) == {"name", "status", "payload", "attempts", "created_ms", "resume", "max_try"}


def test_every_optional_field_is_written_when_set() -> None:
    fields = state_to_hash(full_state(), resume=True, max_try=3)
    assert fields["user"] == "ann"
    assert fields["schedule"] == "nightly"
    assert fields["error"] == "RuntimeError: earlier attempt failed"
    assert fields["started_ms"] == "1700000000100"
    assert fields["finished_ms"] == "1700000000900"
    assert fields["created_ms"] == "1700000000000"
    assert fields["attempts"] == "2"
    assert fields["status"] == "SUCCESS"
    assert all(isinstance(v, str) for v in fields.values())


def test_payload_and_result_are_json_strings_not_re_encoded() -> None:
    state = full_state()
    fields = state_to_hash(state, resume=False, max_try=1)
    # Plain JSON text of the dict: decoding once gives the dict back (not a JSON string of JSON).
    assert json.loads(fields["payload"]) == state.payload
    assert json.loads(fields["result"]) == state.result
    assert fields["payload"].startswith("{") and fields["result"].startswith("{")
    # Compact, as the scripts store it.
    assert fields["result"] == '{"sum":6,"items":["a","b"]}'


def test_an_empty_result_is_kept_as_an_empty_dict() -> None:
    state = JobState(job_id="j", name="n", status=JobStatus.SUCCESS, result={}, created_ms=1)
    fields = state_to_hash(state, resume=False, max_try=1)
    assert fields["result"] == "{}"
    assert state_from_hash(as_redis(fields), "j").result == {}


@pytest.mark.parametrize(("resume", "max_try", "expected"), [(True, 3, ("1", "3")), (False, 1, ("0", "1"))])
def test_resume_and_max_try_are_written(resume: bool, max_try: int, expected: tuple[str, str]) -> None:
    fields = state_to_hash(bare_state(), resume=resume, max_try=max_try)
    assert (fields["resume"], fields["max_try"]) == expected


def test_unicode_survives() -> None:
    state = JobState(
        job_id="j-ü",
        name="test_store_schema.unicode",
        user_uid="zoë",
        payload={"text": "héllo wörld — 日本語 🎉", "ключ": "значение"},
        result={"echo": "🎉"},
        error="ValueError: naïve ✗",
        schedule_name="tägliche",
        created_ms=5,
    )
    fields = state_to_hash(state, resume=False, max_try=1)
    # Non-ASCII is stored as is (not \\u escapes).
    assert "日本語 🎉" in fields["payload"] and "\\u" not in fields["payload"]
    assert state_from_hash(as_redis(fields), state.job_id) == state


async def test_round_trip_through_redis(redis: Redis, namespace: str) -> None:
    """What HSET stores and HGETALL returns reads back as the same state."""
    keys = KeySpace(namespace)
    for state in (full_state(), bare_state()):
        await redis.hset(keys.state(state.job_id), mapping=state_to_hash(state, resume=True, max_try=2))  # type: ignore[arg-type]
        raw = await redis.hgetall(keys.state(state.job_id))  # type: ignore[misc]
        assert state_from_hash(raw, state.job_id) == state
        assert raw[b"resume"] == b"1" and raw[b"max_try"] == b"2"


def test_the_id_is_the_keys_not_a_field() -> None:
    """The hash does not repeat the id its key holds; a state written with an `id` field (by an
    earlier version) still reads back, under its key's id."""
    state = full_state()
    fields = state_to_hash(state, resume=False, max_try=1)
    assert "id" not in fields and state.job_id not in fields.values()
    assert state_from_hash(as_redis({**fields, "id": state.job_id}), state.job_id) == state


def test_a_hash_missing_a_required_field_is_an_error() -> None:
    fields = state_to_hash(bare_state(), resume=False, max_try=1)
    for required in ("name", "status", "payload", "created_ms"):
        broken = {k: v for k, v in fields.items() if k != required}
        with pytest.raises(KeyError):
            state_from_hash(as_redis(broken), "j-bare")


def test_an_unknown_status_is_an_error() -> None:
    fields = {**state_to_hash(bare_state(), resume=False, max_try=1), "status": "LOST"}
    with pytest.raises(ValueError, match="LOST"):
        state_from_hash(as_redis(fields), "j-bare")


def test_a_non_json_payload_is_refused_on_write() -> None:
    state = JobState(job_id="j", name="n", payload={"bad": float("nan")}, created_ms=1)
    with pytest.raises(ValueError):
        state_to_hash(state, resume=False, max_try=1)


# JSON-safe values: what check_json_safe accepts (str keys, lists not tuples, finite floats).
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
JSON_OBJECTS = st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(
    payload=JSON_OBJECTS,
    result=st.none() | JSON_OBJECTS,
    user=st.none() | st.text(min_size=1, max_size=10),
    error=st.none() | st.text(min_size=1, max_size=20),
    attempts=st.integers(min_value=0, max_value=50),
    status=st.sampled_from(list(JobStatus)),
)
def test_round_trip_of_any_json_payload(
    payload: dict[str, Any], result: dict[str, Any] | None, user: str | None, error: str | None, attempts: int,
    status: JobStatus,
) -> None:
    state = JobState(
        job_id="j", name="n", user_uid=user, status=status, payload=payload, result=result, error=error,
        attempts=attempts, created_ms=1_700_000_000_000,
    )
    fields = state_to_hash(state, resume=True, max_try=3)
    assert json.loads(fields["payload"]) == payload
    assert state_from_hash(as_redis(fields), "j") == state
