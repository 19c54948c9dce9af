"""ConnectionGuard on a real Redis: the circuit (threshold, cooldown, one trial), pacing, state as data,
expiry, configuration and Redis outages. Timings in tens of milliseconds."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import pickle
import statistics
import time
from dataclasses import replace
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from agent_async import (
    AgentError,
    CircuitState,
    ConfigurationError,
    ConnectionCoolingDown,
    ConnectionGuard,
    GuardConfig,
    GuardRetryable,
    GuardState,
    QueueUnavailableError,
)
from agent_async.guard import GuardPermit, is_transient
from agent_async.store import KeySpace

NAME = "ics:example.org"
FAST = GuardConfig(failure_threshold=3, cooldown_s=0.15, trial_timeout_s=0.3)
# Two starts may be closer than the interval by the difference of their callers' wake-up delays.
WAKE_TOLERANCE_S = 0.002


def guard_for(redis: Redis, namespace: str, config: GuardConfig = FAST) -> ConnectionGuard:
    return ConnectionGuard(redis, namespace=namespace, default=config)


async def fail(guard: ConnectionGuard, name: str = NAME, exc: BaseException | None = None) -> None:
    raised = exc if exc is not None else ConnectionError("connection refused")
    with pytest.raises(type(raised)):
        async with guard.request(name):
            raise raised


async def succeed(guard: ConnectionGuard, name: str = NAME) -> GuardPermit:
    async with guard.request(name) as permit:
        return permit


async def open_circuit(guard: ConnectionGuard, name: str = NAME) -> None:
    for _ in range(guard.config_for(name).failure_threshold):
        await fail(guard, name)
    assert (await guard.state(name)).state is CircuitState.OPEN


async def half_open(guard: ConnectionGuard, name: str = NAME) -> None:
    await open_circuit(guard, name)
    await asyncio.sleep(guard.config_for(name).cooldown_s + 0.01)
    assert (await guard.state(name)).state is CircuitState.HALF_OPEN


# -- the circuit ----------------------------------------------------------------------------------


async def test_threshold_failures_in_a_row_open_the_cooldown(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await fail(guard)
    await fail(guard)
    assert (await guard.state(NAME)).state is CircuitState.CLOSED
    await fail(guard)
    state = await guard.state(NAME)
    assert state.state is CircuitState.OPEN
    assert state.failures == 3


async def test_during_the_cooldown_requests_fail_fast_with_the_time_left(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await open_circuit(guard)
    entered = False
    t0 = time.monotonic()
    with pytest.raises(ConnectionCoolingDown) as refused:
        async with guard.request(NAME):
            entered = True
    assert not entered
    assert time.monotonic() - t0 < 0.05, "refused at once, not after a wait"
    assert not refused.value.trial_in_flight
    state = await guard.state(NAME)
    assert state.cooldown_until_ms is not None
    assert 0 < refused.value.retry_after_s <= FAST.cooldown_s
    # retry_after_s is the cooldown's end on Redis's clock, within the round trips in between.
    assert refused.value.retry_after_s == pytest.approx((state.cooldown_until_ms - state.observed_ms) / 1000, abs=0.01)
    await asyncio.sleep(refused.value.retry_after_s + 0.005)
    assert (await succeed(guard)).trial, "admitted as soon as retry_after_s has passed"


async def test_half_open_admits_exactly_one_of_twenty_concurrent_callers(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await half_open(guard)
    permits: list[GuardPermit] = []

    async def attempt() -> None:
        async with guard.request(NAME) as permit:
            permits.append(permit)
            await asyncio.sleep(0.05)

    results = await asyncio.gather(*(attempt() for _ in range(20)), return_exceptions=True)
    refused = [r for r in results if isinstance(r, ConnectionCoolingDown)]
    assert len(permits) == 1 and permits[0].trial
    assert len(refused) == 19 and all(r.trial_in_flight for r in refused)
    assert all(0 < r.retry_after_s <= FAST.trial_timeout_s for r in refused)
    assert (await guard.state(NAME)).state is CircuitState.CLOSED, "the trial succeeded"


async def test_trial_success_closes_the_circuit_and_resets_the_count(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await half_open(guard)
    assert (await succeed(guard)).trial
    state = await guard.state(NAME)
    assert (state.state, state.failures, state.cooldown_until_ms) == (CircuitState.CLOSED, 0, None)
    permits = await asyncio.gather(*(succeed(guard) for _ in range(10)))
    assert not any(p.trial for p in permits), "closed: everyone goes, nobody is a trial"


async def test_trial_failure_reopens_for_a_full_cooldown(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await half_open(guard)
    await fail(guard, exc=TimeoutError("read timed out"))
    state = await guard.state(NAME)
    assert state.state is CircuitState.OPEN
    assert state.retry_after_s == pytest.approx(FAST.cooldown_s, abs=0.02)
    assert state.last_error == "TimeoutError"
    with pytest.raises(ConnectionCoolingDown):
        await succeed(guard)


async def test_a_trial_never_released_lapses_after_trial_timeout(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await half_open(guard)
    crashed = guard.request(NAME)
    assert (await crashed.__aenter__()).trial  # its process "dies": never exited
    with pytest.raises(ConnectionCoolingDown) as refused:
        await succeed(guard)
    assert refused.value.trial_in_flight
    assert 0 < refused.value.retry_after_s <= FAST.trial_timeout_s
    await asyncio.sleep(refused.value.retry_after_s + 0.01)
    assert (await succeed(guard)).trial, "a new trial once the reservation lapsed"
    assert (await guard.state(NAME)).state is CircuitState.CLOSED
    # The lapsed trial's late verdict has no say: it counts as a failure, it does not reopen.
    await crashed.__aexit__(ConnectionError, ConnectionError("late"), None)
    state = await guard.state(NAME)
    assert (state.state, state.failures) == (CircuitState.CLOSED, 1)


async def test_a_cancelled_trial_frees_the_circuit_at_once(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await half_open(guard)
    entered = asyncio.Event()

    async def hold() -> None:
        async with guard.request(NAME):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(hold())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = await guard.state(NAME)
    assert (state.state, state.trial_until_ms) == (CircuitState.HALF_OPEN, None), "no verdict, no trial held"
    assert (await succeed(guard)).trial


async def test_cancelled_while_waiting_for_its_slot_frees_the_trial_and_the_slot(redis: Redis, namespace: str) -> None:
    config = GuardConfig(min_interval_s=0.25, failure_threshold=1, cooldown_s=0.05, trial_timeout_s=1.0)
    guard = guard_for(redis, namespace, config)
    await fail(guard)  # takes a slot: the next one is 250 ms later
    before = await guard.state(NAME)
    await asyncio.sleep(0.06)
    task = asyncio.create_task(succeed(guard))  # the trial, paced: it waits for that slot
    await asyncio.sleep(0.03)
    reserved = await guard.state(NAME)
    assert reserved.trial_until_ms is not None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    after = await guard.state(NAME)
    assert (after.state, after.trial_until_ms) == (CircuitState.HALF_OPEN, None)
    assert after.next_slot_ms == before.next_slot_ms, "the unused slot was handed back"
    permit = await succeed(guard)
    assert permit.trial and permit.slot_us // 1000 == before.next_slot_ms


async def test_any_success_resets_the_failure_count(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await fail(guard)
    await fail(guard)
    await succeed(guard)
    await fail(guard)
    await fail(guard)
    state = await guard.state(NAME)
    assert (state.state, state.failures) == (CircuitState.CLOSED, 2)
    await fail(guard)
    assert (await guard.state(NAME)).state is CircuitState.OPEN


async def test_non_retryable_errors_never_count_and_propagate_unchanged(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await fail(guard)
    for exc in (KeyError("uid"), ValueError("not an ICS file"), QueueUnavailableError("our Redis, not theirs")):
        for _ in range(5):
            await fail(guard, exc=exc)
    state = await guard.state(NAME)
    # The host answered: like a success, the count starts again.
    assert (state.state, state.failures) == (CircuitState.CLOSED, 0)


class HTTPStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


async def test_callers_choose_what_counts(redis: Redis, namespace: str) -> None:
    def server_side(exc: BaseException) -> bool:
        return is_transient(exc) or (isinstance(exc, HTTPStatus) and (exc.status == 429 or exc.status >= 500))

    guard = guard_for(redis, namespace, replace(FAST, is_retryable=server_side))
    await fail(guard, exc=HTTPStatus(404))
    assert (await guard.state(NAME)).failures == 0
    await fail(guard, exc=HTTPStatus(503))
    await fail(guard, exc=HTTPStatus(429))
    await fail(guard, exc=GuardRetryable("HTTP 502"))  # always counts, whatever the rule
    state = await guard.state(NAME)
    assert (state.state, state.last_error) == (CircuitState.OPEN, "GuardRetryable")


def test_the_default_rule_counts_connection_failures_only() -> None:
    request = httpx.Request("GET", "https://example.org/cal.ics")
    transient = [ConnectionRefusedError(), TimeoutError(), OSError(), httpx.ConnectTimeout("t", request=request),
                 httpx.RemoteProtocolError("eof", request=request), GuardRetryable()]
    response = httpx.Response(503, request=request)
    answered = [ValueError(), KeyError(), httpx.HTTPStatusError("503", request=request, response=response),
                QueueUnavailableError("Redis"), ConnectionCoolingDown("x", 1.0)]
    assert [is_transient(e) for e in transient] == [True] * len(transient)
    assert [is_transient(e) for e in answered] == [False] * len(answered)


async def test_stragglers_failing_during_the_cooldown_do_not_extend_it(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace, replace(FAST, failure_threshold=2))
    go = asyncio.Event()

    async def straggler() -> None:
        async with guard.request(NAME):
            await go.wait()
            raise ConnectionResetError()

    late = asyncio.create_task(straggler())  # admitted while closed
    await asyncio.sleep(0.01)
    await fail(guard)
    await fail(guard)
    opened = await guard.state(NAME)
    go.set()
    with pytest.raises(ConnectionResetError):
        await late
    after = await guard.state(NAME)
    assert after.failures == 3 and after.cooldown_until_ms == opened.cooldown_until_ms


async def test_a_timeout_outside_the_block_is_no_verdict(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace, replace(FAST, failure_threshold=1))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01), guard.request(NAME):
            await asyncio.sleep(1)
    assert (await guard.state(NAME)).state is CircuitState.CLOSED, "cancelled from outside: not the host's fault"
    with pytest.raises(TimeoutError):
        async with guard.request(NAME), asyncio.timeout(0.01):
            await asyncio.sleep(1)
    assert (await guard.state(NAME)).state is CircuitState.OPEN, "the request's own timeout counts"


# -- pacing ---------------------------------------------------------------------------------------


def pacing_figures(entries: list[tuple[int, int]], interval_s: float) -> dict[str, Any]:
    """Check paced starts, given (start, slot) pairs in microseconds of Redis's clock; returns the figures.

    A gap between two starts is (their slots' gap) + (the later one's lateness) - (the earlier
    one's lateness). So the guard's claim is exactly: slots never closer than the interval, and no
    start before its slot. A gap below interval - tolerance can then only come from an earlier
    caller that started late after its slot (its process held up on a shared machine), which no
    guard can prevent: such pairs are counted (`late_pairs`), everything else must hold the line.
    """
    interval_us, tolerance_us = round(interval_s * 1_000_000), round(WAKE_TOLERANCE_S * 1_000_000)
    slots = sorted(slot for _, slot in entries)
    slot_gaps = [b - a for a, b in itertools.pairwise(slots)]
    lateness = [start - slot for start, slot in entries]
    by_start = sorted(entries)
    gaps = [(b[0] - a[0], a[0] - a[1]) for a, b in itertools.pairwise(by_start)]
    below = [(gap, earlier_late) for gap, earlier_late in gaps if gap < interval_us - tolerance_us]
    short = [gap for gap, earlier_late in below if earlier_late <= tolerance_us]
    assert min(slot_gaps) >= interval_us, "Redis handed out two slots closer than the interval"
    assert min(lateness) >= 0, "a request started before its slot"
    assert short == [], f"starts closer than the interval - {WAKE_TOLERANCE_S * 1000} ms: {short}"
    assert statistics.median(lateness) <= 5_000, "callers wake on their slot, not late by their reply's delay"
    return {
        "acquisitions": len(entries),
        "min_interval_ms": interval_s * 1000,
        "min_gap_ms": round(min(gap for gap, _ in gaps) / 1000, 3),
        "min_slot_gap_ms": round(min(slot_gaps) / 1000, 3),
        "p50_late_ms": round(statistics.median(lateness) / 1000, 3),
        "max_late_ms": round(max(lateness) / 1000, 3),
        "late_pairs": len(below) - len(short),
    }


async def redis_time_us(redis: Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1_000_000 + int(micros)


async def test_pacing_spaces_every_start_by_the_interval(redis: Redis, namespace: str) -> None:
    interval_s = 0.02
    guard = guard_for(redis, namespace, replace(FAST, min_interval_s=interval_s))
    entries: list[tuple[int, int]] = []

    async def timed() -> None:
        async with guard.request(NAME) as permit:
            entries.append((await redis_time_us(redis), permit.slot_us))

    for _ in range(5):
        await timed()
    await asyncio.gather(*(timed() for _ in range(10)))
    pacing_figures(entries, interval_s)
    # The concurrent ten queue up back to back: no slot is wasted.
    slots = sorted(slot for _, slot in entries)
    assert slots[-1] - slots[5] == 9 * interval_s * 1_000_000


async def test_pacing_is_per_name(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace, replace(FAST, min_interval_s=0.5))
    t0 = time.monotonic()
    await asyncio.gather(*(succeed(guard, f"ics:host-{i}") for i in range(5)))
    assert time.monotonic() - t0 < 0.2


# -- state, keys, configuration, Redis --------------------------------------------------------------


async def test_state_is_data_in_every_circuit_state(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace, replace(FAST, min_interval_s=0.01))
    fresh = await guard.state(NAME)
    assert (fresh.state, fresh.failures, fresh.last_error, fresh.retry_after_s) == (CircuitState.CLOSED, 0, None, 0.0)
    assert fresh.observed_ms == pytest.approx(time.time() * 1000, abs=1000)

    await fail(guard)
    one = await guard.state(NAME)
    assert (one.state, one.failures, one.last_error) == (CircuitState.CLOSED, 1, "ConnectionError")
    assert one.last_error_ms is not None and 0 <= one.observed_ms - one.last_error_ms < 100
    assert one.next_slot_ms is not None

    await fail(guard)
    await fail(guard)
    opened = await guard.state(NAME)
    assert opened.state is CircuitState.OPEN
    assert opened.cooldown_until_ms == pytest.approx(opened.last_error_ms + FAST.cooldown_s * 1000, abs=2)
    assert 0 < opened.retry_after_s <= FAST.cooldown_s

    await asyncio.sleep(FAST.cooldown_s + 0.01)
    waiting = await guard.state(NAME)
    assert (waiting.state, waiting.trial_until_ms, waiting.retry_after_s) == (CircuitState.HALF_OPEN, None, 0.0)
    async with guard.request(NAME):
        trying = await guard.state(NAME)
    assert trying.state is CircuitState.HALF_OPEN and trying.trial_until_ms is not None
    assert 0 < trying.retry_after_s <= FAST.trial_timeout_s
    assert json.loads(json.dumps(trying.to_dict()))["state"] == "half-open"

    closed = await guard.state(NAME)
    assert (closed.state, closed.failures, closed.cooldown_until_ms) == (CircuitState.CLOSED, 0, None)
    assert closed.last_error == "ConnectionError", "the last error stays readable"
    assert isinstance(closed, GuardState)


async def test_every_guard_key_expires_when_idle(redis: Redis, namespace: str) -> None:
    long = GuardConfig(min_interval_s=0.01, failure_threshold=2, cooldown_s=120.0)
    guard = ConnectionGuard(redis, namespace=namespace, default=FAST, configs={"slow:*": long})
    for name in (NAME, "slow:host"):
        await succeed(guard, name)
        await open_circuit(guard, name)
    keys = [k async for k in redis.scan_iter(match=f"{KeySpace(namespace).guard('')}*")]
    assert len(keys) == 2
    ttls_ms = {k.decode(): await redis.pttl(k) for k in keys}
    assert all(ttl > 0 for ttl in ttls_ms.values()), ttls_ms
    assert ttls_ms[guard.key(NAME)] == pytest.approx(FAST.idle_ttl_ms + FAST.cooldown_s * 1000, abs=500)
    # Never shorter than the cooldown it holds: an open circuit is not forgotten while open.
    assert ttls_ms[guard.key("slow:host")] >= long.cooldown_s * 1000 + 60_000 - 500
    assert FAST.idle_ttl_ms == 60_000 and long.idle_ttl_ms == 360_000


async def test_states_lists_the_connections_in_use_most_recent_first(redis: Redis, namespace: str) -> None:
    paced = GuardConfig(min_interval_s=0.01)
    guard = ConnectionGuard(redis, namespace=namespace, default=FAST, configs={"paced:*": paced})
    assert await guard.states() == []
    await open_circuit(guard, "ics:down.example")
    await asyncio.sleep(0.005)  # the registry orders by millisecond of last use
    await succeed(guard, "paced:a")
    await asyncio.sleep(0.005)
    await fail(guard, "ics:flaky.example")
    await asyncio.sleep(0.005)
    await succeed(guard, "ics:healthy.example")  # closed, no failures, not paced: nothing recorded
    states = await guard.states()
    assert [s.name for s in states] == ["ics:flaky.example", "paced:a", "ics:down.example"]
    by_name = {s.name: s for s in states}
    assert by_name["ics:down.example"].state is CircuitState.OPEN
    assert by_name["ics:down.example"].failures == FAST.failure_threshold
    assert by_name["ics:flaky.example"].failures == 1
    assert by_name["ics:flaky.example"].last_error == "ConnectionError"
    # `limit` bounds the names looked at (the healthy one is the most recent of them).
    assert [s.name for s in await guard.states(limit=2)] == ["ics:flaky.example"]
    # The registry expires with the namespace's guards, like every other guard key.
    assert 0 < await redis.pttl(KeySpace(namespace).guard_names) <= 86_400_000


async def test_states_forgets_names_whose_state_expired_long_ago(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await fail(guard, "ics:gone.example")
    await fail(guard, "ics:recent.example")
    names = KeySpace(namespace).guard_names
    await redis.delete(guard.key("ics:gone.example"), guard.key("ics:recent.example"))  # as if expired
    await redis.zadd(names, {"ics:gone.example": 1})  # last used in 1970
    assert await guard.states() == []
    assert await redis.zrange(names, 0, -1) == [b"ics:recent.example"]


async def test_reset_closes_an_open_circuit_at_once(redis: Redis, namespace: str) -> None:
    guard = guard_for(redis, namespace)
    await open_circuit(guard)
    with pytest.raises(ConnectionCoolingDown):
        await succeed(guard)
    state = await guard.reset(NAME)
    assert state.state is CircuitState.CLOSED and state.failures == 0 and state.cooldown_until_ms is None
    await succeed(guard)  # admitted again, no cooldown left
    assert (await guard_for(redis, namespace).state(NAME)).state is CircuitState.CLOSED


@pytest.mark.parametrize(
    "fields",
    [
        {"failure_threshold": 0},
        {"failure_threshold": -1},
        {"failure_threshold": 1.5},
        {"failure_threshold": True},
        {"min_interval_s": -0.001},
        {"min_interval_s": math.nan},
        {"cooldown_s": -1.0},
        {"cooldown_s": math.inf},
        {"trial_timeout_s": 0.0},
        {"trial_timeout_s": "30"},
        {"is_retryable": "ConnectionError"},
    ],
)
def test_nonsensical_config_is_refused_at_construction(fields: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        GuardConfig(**fields)


def test_per_name_configs_exact_name_then_longest_prefix_then_default() -> None:
    ics, host, other = GuardConfig(cooldown_s=1.0), GuardConfig(cooldown_s=2.0), GuardConfig(cooldown_s=3.0)
    guard = ConnectionGuard(
        lambda: Redis(),  # never called: constructing opens nothing
        namespace="ns",
        default=other,
        configs={"ics:*": ics, "ics:example.org": host, "ics:ex*": GuardConfig(cooldown_s=4.0)},
    )
    assert guard.config_for("ics:example.org") is host
    assert guard.config_for("ics:exotic.net").cooldown_s == 4.0
    assert guard.config_for("ics:other.net") is ics
    assert guard.config_for("caldav:x") is other
    with pytest.raises(ConfigurationError):
        ConnectionGuard(Redis(), namespace="ns", configs={"x": {"cooldown_s": 1}})  # type: ignore[dict-item]


async def test_a_guard_built_before_the_client_exists(redis: Redis, namespace: str) -> None:
    holder: dict[str, Redis] = {}
    guard = ConnectionGuard(lambda: holder["redis"], namespace=KeySpace(namespace), default=FAST)
    holder["redis"] = redis
    assert not (await succeed(guard)).trial


async def test_redis_down_refuses_the_request(namespace: str) -> None:
    down = Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=0.5)
    guard = guard_for(down, namespace)
    entered = False
    with pytest.raises(QueueUnavailableError) as refused:
        async with guard.request(NAME):
            entered = True
    assert not entered, "never let through unguarded"
    assert isinstance(refused.value, AgentError)
    with pytest.raises(QueueUnavailableError):
        await guard.state(NAME)
    await down.aclose()


async def test_redis_lost_after_admission_leaves_the_block_outcome_alone(
    redis: Redis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    down = Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=0.5)
    clients = iter([redis, down, redis, down])
    guard = ConnectionGuard(lambda: next(clients), namespace=namespace, default=FAST)
    with caplog.at_level(logging.WARNING, logger="agent_async.guard"):
        async with guard.request(NAME):
            pass  # succeeds although its outcome cannot be recorded
        with pytest.raises(LookupError):
            async with guard.request(NAME):
                raise LookupError("the block's own error, not the guard's")
    assert sum("could not record" in r.getMessage() for r in caplog.records) == 2
    await down.aclose()


def test_cooling_down_survives_pickling() -> None:
    exc = pickle.loads(pickle.dumps(ConnectionCoolingDown(NAME, 1.5, trial_in_flight=True)))
    assert (exc.name, exc.retry_after_s, exc.trial_in_flight) == (NAME, 1.5, True)
    assert "retry in 1.500s" in str(exc)
