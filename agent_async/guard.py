"""ConnectionGuard: pacing and a circuit breaker per named outside connection, shared through Redis.

Why this is ours: no library does it right for many worker processes on one Redis. purgatory,
pybreaker and aiobreaker read the breaker's state and write it back in separate steps (two
workers both see "closed", or both take the half-open trial), compare timestamps taken from each
host's own clock, let every caller through once the cooldown has run out instead of exactly one
trial, or block the event loop (pybreaker's Redis storage is synchronous); and none of them
paces requests. Here each decision is one Lua script that reads the state, decides and writes it
back atomically, on Redis's clock (TIME) alone.

    guard = ConnectionGuard(redis, namespace="agent", configs={"ics:*": GuardConfig(min_interval_s=0.5)})
    async with guard.request("ics:example.org"):
        response = await http.get(url)    # put a timeout *inside* the block: its TimeoutError counts

Entering the block: go now; or sleep (asyncio.sleep, the loop runs on) until the paced slot the
script reserved; or raise ConnectionCoolingDown(retry_after_s) at once, nothing sent. Leaving it:
a retryable exception (`GuardConfig.is_retryable`, or a raised GuardRetryable) counts one failure;
`failure_threshold` in a row open a cooldown of `cooldown_s`; then exactly one trial is admitted
(its reservation lapses after `trial_timeout_s`, so a crashed trial cannot wedge the circuit); its
success closes the circuit, its failure reopens it. Any other exit counts as a success (the host
answered: a 404, a body that does not parse) and resets the count. A cancellation is no verdict:
it frees the trial, and the slot too if the request had not started.

Pacing: Redis hands out slots never closer than `min_interval_s`, across all processes; a caller
wakes at its slot mapped onto its monotonic clock (see _SlotClock), so starts are as far apart as
slots, less the event loop's timer jitter (it wakes up to about 1 ms late, never early).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import BusyLoadingError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agent_async.errors import AgentError, ConfigurationError, ConnectionCoolingDown, QueueUnavailableError
from agent_async.store.keys import KeySpace
from agent_async.store.scripts import LuaScript, lua_source, run_script

__all__ = [
    "DEFAULT_GUARD_CONFIG", "CircuitState", "ConnectionGuard", "GuardConfig", "GuardPermit", "GuardRetryable",
    "GuardState", "is_transient",
]

logger = logging.getLogger(__name__)

# A guard's state outlives an idle spell this long, or this many times its longest timing; then it
# is forgotten (a connection unused for that long starts again closed, no failures counted).
_MIN_IDLE_TTL_MS = 60_000
_IDLE_TTL_FACTOR = 3
# How long one estimate of Redis's clock on ours is trusted before it is taken afresh (bounds drift).
_CLOCK_WINDOW_S = 10.0
# `ConnectionGuard.states()` lists at most this many connections by default.
MAX_LISTED = 500
# A listed name whose state has expired is dropped from the registry this long after its last use.
_FORGET_NAME_MS = 86_400_000


class GuardRetryable(AgentError):
    """Raise inside a guarded block to count a failure the rule would not (an HTTP 429 or 5xx); it
    propagates out of the block unchanged, like any other exception."""


def is_transient(exc: BaseException) -> bool:
    """The default retryable rule: the connection failed, not the request.

    OSError covers ConnectionError and TimeoutError (asyncio's included); httpx's TransportError
    (connect, read, pool timeouts, protocol errors) is recognised by name, so httpx stays optional.
    The library's own errors (Redis down under QueueUnavailableError, say) are never the host's fault.
    """
    if isinstance(exc, AgentError):
        return isinstance(exc, GuardRetryable)
    if isinstance(exc, OSError):
        return True
    return any(cls.__name__ == "TransportError" and cls.__module__.startswith("httpx") for cls in type(exc).__mro__)


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """How one named connection is paced and when its circuit opens. Seconds throughout.

    `is_retryable(exc)` says which exceptions count as failures (a GuardRetryable always does).
    Every process using a name should give it the same config: the state is shared, the numbers
    each call applies are its caller's.
    """

    min_interval_s: float = 0.0
    failure_threshold: int = 5
    cooldown_s: float = 30.0
    # How long a half-open trial may take before another caller gets a trial instead.
    trial_timeout_s: float = 30.0
    is_retryable: Callable[[BaseException], bool] = is_transient

    def __post_init__(self) -> None:
        threshold = self.failure_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise ConfigurationError(f"GuardConfig.failure_threshold must be an int of at least 1, not {threshold!r}")
        for name, value, positive in (
            ("min_interval_s", self.min_interval_s, False),
            ("cooldown_s", self.cooldown_s, False),
            ("trial_timeout_s", self.trial_timeout_s, True),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigurationError(f"GuardConfig.{name} must be a finite number of seconds, not {value!r}")
            if value < 0 or (positive and value == 0):
                raise ConfigurationError(f"GuardConfig.{name} must be {'positive' if positive else '>= 0'}: {value}")
        if not callable(self.is_retryable):
            raise ConfigurationError("GuardConfig.is_retryable must be a callable taking the exception")

    @property
    def idle_ttl_ms(self) -> int:
        longest_s = max(self.cooldown_s, self.min_interval_s, self.trial_timeout_s)
        return max(_MIN_IDLE_TTL_MS, math.ceil(_IDLE_TTL_FACTOR * longest_s * 1000))


DEFAULT_GUARD_CONFIG = GuardConfig()


class CircuitState(Enum):
    CLOSED = "closed"  # requests go (paced)
    OPEN = "open"  # cooling down: every request refused at once
    HALF_OPEN = "half-open"  # cooldown over: one trial request at a time, the rest refused

    @classmethod
    def from_code(cls, code: int) -> CircuitState:
        """The Lua scripts' circuit codes (guard_lib.lua)."""
        return (cls.CLOSED, cls.OPEN, cls.HALF_OPEN)[code]


@dataclass(frozen=True, slots=True)
class GuardState:
    """A guarded connection as data (for an API or metrics). Times: epoch ms on Redis's clock.

    `cooldown_until_ms` is when the cooldown ends (OPEN) or ended (HALF_OPEN); `trial_until_ms`,
    when the trial in flight loses its reservation; `next_slot_ms`, the earliest start the next
    paced request can get (in the past when the connection is idle). None: not recorded.
    """

    name: str
    state: CircuitState
    failures: int  # retryable failures in a row
    cooldown_until_ms: int | None
    trial_until_ms: int | None
    next_slot_ms: int | None
    last_error: str | None  # class name of the last retryable failure
    last_error_ms: int | None
    observed_ms: int  # Redis's clock when this was read

    @property
    def retry_after_s(self) -> float:
        """How long a request would be refused from `observed_ms` on (0: it would be admitted)."""
        until_ms = self.cooldown_until_ms if self.state is CircuitState.OPEN else self.trial_until_ms
        return 0.0 if until_ms is None else max(0.0, (until_ms - self.observed_ms) / 1000)

    def to_dict(self) -> dict[str, object]:
        """JSON types only: the state by its value ("half-open"), times in ms."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return {**fields, "state": self.state.value, "retry_after_s": self.retry_after_s}


@dataclass(frozen=True, slots=True)
class GuardPermit:
    """What `async with guard.request(name) as permit` gives: how the request was admitted."""

    name: str
    trial: bool  # the one request of a half-open circuit
    waited_s: float  # the paced wait before the slot
    slot_us: int  # the slot, epoch microseconds on Redis's clock
    token: str = field(repr=False)  # tells this caller's trial from a later one's


class _Outcome(Enum):
    OK = "ok"
    FAIL = "fail"
    DROP = "drop"  # no verdict: cancelled, or given up before it started


class _SlotClock:
    """Redis's clock mapped onto this process's monotonic clock, to wake paced callers on their slot.

    A reply reaches its caller some delay after the script read TIME; sleeping the script's wait
    from then makes each caller late by its own delay, and in a burst the loop hands replies out
    milliseconds apart. The smallest (receipt - Redis time) seen is the mapping with the least
    delay in it: since no delay is negative, waking at slot + that offset is never early. Taken
    afresh every _CLOCK_WINDOW_S (a later estimate only wakes callers later), so drift stays small.
    """

    __slots__ = ("_offset_s", "_since")

    def __init__(self) -> None:
        self._offset_s = math.inf
        self._since = -math.inf

    def observe(self, redis_now_us: int, received: float) -> None:
        """A reply computed at `redis_now_us` (Redis's clock) arrived at `received` (time.monotonic())."""
        offset_s = received - redis_now_us / 1_000_000
        if offset_s < self._offset_s or received - self._since > _CLOCK_WINDOW_S:
            self._offset_s, self._since = offset_s, received

    def wait_s(self, slot_us: int) -> float:
        return max(0.0, slot_us / 1_000_000 + self._offset_s - time.monotonic())


def _script(name: str) -> LuaScript:
    return LuaScript(lua_source("agent_async.store", "guard_lib.lua") + "\n" + lua_source("agent_async.store", name))


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _text(value: object) -> str | None:
    return None if value is None else value.decode() if isinstance(value, bytes) else str(value)


def _ms(value: object) -> int | None:
    """An epoch-microsecond reply as epoch milliseconds."""
    text = _text(value)
    return None if text is None else int(text) // 1000


def _parse_state(name: str, reply: Any) -> GuardState:
    """One entry of guard_state.lua's reply."""
    return GuardState(
        name=name,
        state=CircuitState.from_code(int(reply[0])),
        failures=int(reply[2]),
        cooldown_until_ms=_ms(reply[3]),
        trial_until_ms=_ms(reply[4]),
        next_slot_ms=_ms(reply[5]),
        last_error=_text(reply[6]),
        last_error_ms=_ms(reply[7]),
        observed_ms=int(reply[1]) // 1000,
    )


# What "Redis is down" looks like to a guard call: it becomes QueueUnavailableError (the API's 503).
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, BusyLoadingError)


def _unavailable(what: str, exc: Exception) -> QueueUnavailableError:
    return QueueUnavailableError(f"could not {what}: Redis is unreachable ({exc})")


class ConnectionGuard:
    """Paces and breaks the circuit of named outside connections for every process of a namespace.

    `redis` is a client or a zero-argument callable returning one (so the guard can be built before
    the process connects: `lambda: agent.redis`). `namespace` is the namespace or its KeySpace.
    Per-name configs: `configs` maps a name to its GuardConfig, or a prefix ending in "*" (e.g.
    "ics:*") to the config of every name it starts; an exact name wins over prefixes, the longest
    prefix over shorter ones, and `default` applies to the rest.

    Redis down when a request is admitted or its state read: QueueUnavailableError (nothing goes
    through unguarded). Redis down when an outcome is recorded: logged, and the block's own
    result or exception stands (a lost trial verdict lapses with its reservation).
    """

    def __init__(
        self,
        redis: Redis | Callable[[], Redis],
        *,
        namespace: str | KeySpace,
        default: GuardConfig = DEFAULT_GUARD_CONFIG,
        configs: Mapping[str, GuardConfig] | None = None,
    ) -> None:
        self._redis = redis
        self.keys = namespace if isinstance(namespace, KeySpace) else KeySpace(namespace)
        configs = dict(configs or {})
        for config in (default, *configs.values()):
            if not isinstance(config, GuardConfig):
                raise ConfigurationError(f"ConnectionGuard configs must be GuardConfig, not {config!r}")
        self.default = default
        self._exact = {name: c for name, c in configs.items() if not name.endswith("*")}
        # Longest first, so the first match is the most specific.
        prefixes = [(name[:-1], c) for name, c in configs.items() if name.endswith("*")]
        self._prefixes = sorted(prefixes, key=lambda item: -len(item[0]))
        self._clock = _SlotClock()
        self._acquire = _script("guard_acquire.lua")
        self._release = _script("guard_release.lua")
        self._state = _script("guard_state.lua")

    def config_for(self, name: str) -> GuardConfig:
        found = self._exact.get(name)
        if found is not None:
            return found
        return next((c for prefix, c in self._prefixes if name.startswith(prefix)), self.default)

    def key(self, name: str) -> str:
        """The one Redis key holding a connection's state (a hash, expiring when idle)."""
        return f"{self.keys.guard(name)}:state"

    def request(self, name: str) -> _GuardedRequest:
        """`async with guard.request("ics:example.org") as permit:` around one request to that connection."""
        if not name:
            raise ValueError("a guarded connection needs a name")
        return _GuardedRequest(self, name, self.config_for(name))

    async def state(self, name: str) -> GuardState:
        return (await self._read([name], f"read the state of connection {name}"))[0][0]

    async def states(self, *, limit: int = MAX_LISTED) -> list[GuardState]:
        """Every connection with a recorded state (failures, cooldown, trial or pacing), most
        recently used first, among the `limit` connections used last.

        Names come from a registry every admission updates; a name whose state has expired and
        that was last used over a day ago is dropped from it here, so the registry stays about as
        small as the set of connections in use.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        redis = self._client()
        try:
            listed = await redis.zrevrange(self.keys.guard_names, 0, limit - 1, withscores=True)
        except _UNREACHABLE as exc:
            raise _unavailable("list the guarded connections", exc) from exc
        names = [_text(name) or "" for name, _ in listed]
        if not names:
            return []
        read = await self._read(names, "list the guarded connections")
        forget = [
            name for (state, exists), (name, last_used_ms) in zip(read, listed, strict=True)
            if not exists and state.observed_ms - last_used_ms > _FORGET_NAME_MS
        ]
        if forget:
            await redis.zrem(self.keys.guard_names, *forget)
        return [state for state, exists in read if exists]

    async def _read(self, names: list[str], what: str) -> list[tuple[GuardState, bool]]:
        """Each name's state, and whether Redis holds one for it (one script call for all)."""
        try:
            replies = await run_script(self._client(), self._state([self.key(name) for name in names], []))
        except _UNREACHABLE as exc:
            raise _unavailable(what, exc) from exc
        return [(_parse_state(name, reply), int(reply[8]) == 1) for name, reply in zip(names, replies, strict=True)]

    async def reset(self, name: str) -> GuardState:
        """Forget a connection's failures, cooldown, trial and pacing: it starts again closed.

        For an operator who knows the outside service is back. A trial in flight when this runs
        reports to the fresh state (its verdict counts as any request's would).
        """
        try:
            await self._client().delete(self.key(name))
        except _UNREACHABLE as exc:
            raise _unavailable(f"reset connection {name}", exc) from exc
        logger.warning("connection %s: reset by an operator (failures and cooldown forgotten)", name)
        return await self.state(name)

    def _client(self) -> Redis:
        return self._redis if isinstance(self._redis, Redis) else self._redis()

    async def _admit(self, name: str, config: GuardConfig) -> GuardPermit:
        token = os.urandom(8).hex()  # 64 random bits: unique enough among the trials of one name
        args: list[str | int] = [
            token, _us(config.min_interval_s), _us(config.trial_timeout_s), config.idle_ttl_ms, name,
        ]
        try:
            reply = await run_script(self._client(), self._acquire([self.key(name), self.keys.guard_names], args))
        except _UNREACHABLE as exc:
            raise _unavailable(f"admit a request to connection {name}", exc) from exc
        received = time.monotonic()
        code, wait_us = int(reply[0]), int(reply[1])
        if code < 0:
            raise ConnectionCoolingDown(name, wait_us / 1_000_000, trial_in_flight=code == -2)
        slot_us = int(reply[2])
        self._clock.observe(slot_us - wait_us, received)
        wait_s = self._clock.wait_s(slot_us) if wait_us > 0 else 0.0
        permit = GuardPermit(name, code == 1, waited_s=wait_s, slot_us=slot_us, token=token)
        if wait_s > 0:
            try:
                await asyncio.sleep(wait_s)
            except BaseException:
                # Given up before it started: free the trial, and the slot if nobody reserved the next.
                await self._settle(permit, config, _Outcome.DROP, None, hand_back_slot=True)
                raise
        return permit

    async def _settle(
        self, permit: GuardPermit, config: GuardConfig, outcome: _Outcome, exc: BaseException | None,
        *, hand_back_slot: bool = False,
    ) -> None:
        args: list[str | int] = [
            permit.token, outcome.value, "1" if permit.trial else "", permit.slot_us if hand_back_slot else "",
            _us(config.min_interval_s), config.failure_threshold, _us(config.cooldown_s), config.idle_ttl_ms,
            type(exc).__name__ if exc is not None else "",
        ]
        call = run_script(self._client(), self._release([self.key(permit.name)], args))
        try:
            # A cancelled caller may be cancelled again while it waits: the verdict is written anyway.
            reply: Any = await (asyncio.shield(call) if outcome is _Outcome.DROP else call)
        except (RedisError, OSError) as redis_exc:
            logger.warning("connection %s: could not record the request's outcome (%s)", permit.name, redis_exc)
            return
        if int(reply[2]) == 1:
            logger.warning(
                "connection %s: circuit open for %.3gs after %d failure(s) in a row (last: %s)",
                permit.name, config.cooldown_s, int(reply[1]), type(exc).__name__,
            )
        elif permit.trial and outcome is _Outcome.OK and int(reply[0]) == 0:
            logger.info("connection %s: trial request succeeded, circuit closed", permit.name)


class _GuardedRequest:
    """The async context manager of one request: admitted on entry, its outcome recorded on exit."""

    __slots__ = ("_config", "_guard", "_name", "_permit")

    def __init__(self, guard: ConnectionGuard, name: str, config: GuardConfig) -> None:
        self._guard = guard
        self._name = name
        self._config = config
        self._permit: GuardPermit | None = None

    async def __aenter__(self) -> GuardPermit:
        self._permit = await self._guard._admit(self._name, self._config)
        return self._permit

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._permit is None:
            return
        permit, self._permit = self._permit, None
        await self._guard._settle(permit, self._config, self._classify(exc), exc)

    def _classify(self, exc: BaseException | None) -> _Outcome:
        if exc is None:
            return _Outcome.OK
        if not isinstance(exc, Exception):
            return _Outcome.DROP  # CancelledError, KeyboardInterrupt, SystemExit: no verdict on the host
        if isinstance(exc, GuardRetryable):
            return _Outcome.FAIL
        try:
            retryable = self._config.is_retryable(exc)
        except Exception:
            # A broken rule must not leave the permit unsettled (a trial would wedge until it lapses).
            logger.exception("connection %s: is_retryable raised; counting a failure", self._name)
            return _Outcome.FAIL
        return _Outcome.FAIL if retryable else _Outcome.OK
