"""engine.wire: arq's job bytes as JSON, engine job ids under the namespace, arq's keys, dropped results."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.jobs import deserialize_job, serialize_result

from agent_async.engine.wire import Dropped, EngineNames, dropped_from_result, serialize, wire_dumps, wire_loads
from agent_async.store import EngineRef

ENQUEUED_MS = 1_700_000_000_123


def arq_result(result: object, *, success: bool = False) -> bytes:
    """The result bytes arq itself stores for a job, with our serializer."""
    raw = serialize_result(
        "test_engine_wire.fn", ({"x": 1},), {}, 1, ENQUEUED_MS, success, result,
        ENQUEUED_MS + 1, ENQUEUED_MS + 2, "ref", "ns:queue", "ns:j1", serializer=wire_dumps,
    )
    assert raw is not None
    return raw


# -- wire_dumps / wire_loads -----------------------------------------------------------------------


def test_wire_round_trip() -> None:
    value = {"t": 1, "f": "fn", "a": [{"text": "zoë 🎉", "n": [1, 2.5, None, True]}], "k": {}, "et": ENQUEUED_MS}
    raw = wire_dumps(value)
    assert isinstance(raw, bytes)
    assert wire_loads(raw) == value


def test_wire_bytes_are_json() -> None:
    raw = wire_dumps({"a": ["ü"]})
    assert raw == '{"a":["ü"]}'.encode()
    assert json.loads(raw) == {"a": ["ü"]}


def test_wire_dumps_refuses_what_json_cannot_carry() -> None:
    with pytest.raises(TypeError):
        wire_dumps({"a": object()})
    with pytest.raises(ValueError):
        wire_dumps({"a": float("nan")})


def test_wire_dumps_keeps_an_exceptions_type_and_message() -> None:
    assert json.loads(wire_dumps({"r": KeyError("k")})) == {"r": {"exc_type": "KeyError", "message": "'k'"}}


def test_wire_loads_refuses_what_is_not_json() -> None:
    import pickle

    with pytest.raises(ValueError):
        wire_loads(pickle.dumps({"f": "fn"}))


# -- serialize -------------------------------------------------------------------------------------


def test_serialize_is_read_back_by_arqs_own_deserializer() -> None:
    payload = {"text": "héllo", "numbers": [1, 2], "nested": {"ok": None}}
    raw = serialize("test_engine_wire.fn", payload, ENQUEUED_MS)

    job = deserialize_job(raw, deserializer=wire_loads)

    assert job.function == "test_engine_wire.fn"
    # JSON has no tuples: arq gets the positional arguments as a list, which it spreads the same way.
    assert tuple(job.args) == (payload,)
    assert job.kwargs == {}
    assert job.job_try is None
    assert job.enqueue_time == datetime.fromtimestamp(ENQUEUED_MS / 1000, UTC)


def test_serialize_writes_plain_json() -> None:
    raw = serialize("fn", {"a": 1}, ENQUEUED_MS)
    assert json.loads(raw) == {"t": None, "f": "fn", "a": [{"a": 1}], "k": {}, "et": ENQUEUED_MS}


def test_serialize_refuses_a_payload_json_cannot_carry() -> None:
    from arq.jobs import SerializationError

    with pytest.raises(SerializationError):
        serialize("fn", {"when": object()}, ENQUEUED_MS)


# -- EngineNames -----------------------------------------------------------------------------------


def test_engine_job_id_round_trip() -> None:
    names = EngineNames("ns-a")
    for job_id in ("0123456789abcdef", "a", "with:colon"):
        engine_id = names.engine_job_id(job_id)
        assert engine_id.startswith("ns-a:")
        assert names.job_id(engine_id) == job_id


def test_job_id_of_another_namespace_is_none() -> None:
    ours, theirs = EngineNames("ns-a"), EngineNames("ns-b")
    assert ours.job_id(theirs.engine_job_id("j1")) is None
    # A namespace that only starts like ours is another namespace.
    assert ours.job_id(EngineNames("ns-ab").engine_job_id("j1")) is None
    assert ours.job_id(EngineNames("ns").engine_job_id("j1")) is None
    assert ours.job_id("j1") is None


def test_is_cron_tick() -> None:
    names = EngineNames("ns")
    tick = f"{names.cron_function('nightly', 0)}:{ENQUEUED_MS}"
    assert names.is_cron_tick(tick)
    assert names.is_cron_tick(names.override_ticker)
    assert not names.is_cron_tick(names.engine_job_id("0123456789abcdef"))
    assert not names.is_cron_tick(f"{EngineNames('other').cron_function('nightly', 0)}:{ENQUEUED_MS}")


def test_cron_function_names_are_under_the_namespace() -> None:
    names = EngineNames("ns")
    assert names.cron_function("nightly", 2) == "ns:cron:nightly:2"
    assert names.cron_function("nightly", 0) != names.cron_function("nightly", 1)


def test_ref_names_arqs_keys_of_the_namespaced_id() -> None:
    names = EngineNames("ns")
    ref = names.ref("j1")
    assert isinstance(ref, EngineRef)
    assert ref.engine_job_id == "ns:j1"
    assert ref.job_key == job_key_prefix + "ns:j1"
    assert ref.claim_key == in_progress_key_prefix + "ns:j1"
    assert ref.queue_key == names.queue == "ns:queue"


def test_result_and_in_progress_keys_are_arqs() -> None:
    names = EngineNames("ns")
    assert names.result_key("j1") == result_key_prefix + "ns:j1"
    assert names.in_progress_key("ns:j1") == in_progress_key_prefix + "ns:j1"
    assert names.in_progress_key("ns:j1") == names.ref("j1").claim_key


def test_two_namespaces_share_no_engine_name() -> None:
    a, b = EngineNames("one"), EngineNames("two")
    assert a.queue != b.queue
    assert a.ref("j1").job_key != b.ref("j1").job_key
    assert a.ref("j1").claim_key != b.ref("j1").claim_key
    assert a.result_key("j1") != b.result_key("j1")


# -- dropped_from_result ---------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [None, b""])
def test_no_stored_result_is_none(raw: bytes | None) -> None:
    assert dropped_from_result(raw) is None


def test_a_cancelled_error_result_is_a_cancellation() -> None:
    dropped = dropped_from_result(arq_result(asyncio.CancelledError()))
    assert dropped == Dropped("CancelledError", canceled=True)


def test_another_exception_is_a_failure_with_type_and_message() -> None:
    dropped = dropped_from_result(arq_result(RuntimeError("function 'x' not found")))
    assert dropped == Dropped("RuntimeError: function 'x' not found", canceled=False)


def test_an_exception_without_a_message_is_its_type() -> None:
    assert dropped_from_result(arq_result(TimeoutError())) == Dropped("TimeoutError")


def test_a_plain_result_is_its_text() -> None:
    assert dropped_from_result(arq_result("unable to serialize result")) == Dropped("unable to serialize result")


@pytest.mark.parametrize("raw", [b"\x80\x04\x95 not json", b"\xff\xfe", b"[1, 2]", b"not json at all", b'"text"'])
def test_unreadable_bytes(raw: bytes) -> None:
    assert dropped_from_result(raw) == Dropped("unreadable engine result")
