"""The guard's data: what counts as a failure, a connection's config, its state, a permit."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from agent_async.errors import AgentError, ConfigurationError

__all__ = [
    "DEFAULT_GUARD_CONFIG", "CircuitState", "GuardConfig", "GuardPermit", "GuardRetryable", "GuardState",
    "is_transient", "parse_state", "text_of",
]

# A guard's state outlives an idle spell this long, or this many times its longest timing; then it
# is forgotten (a connection unused for that long starts again closed, no failures counted).
_MIN_IDLE_TTL_MS = 60_000
_IDLE_TTL_FACTOR = 3


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



def text_of(value: object) -> str | None:
    return None if value is None else value.decode() if isinstance(value, bytes) else str(value)


def _ms(value: object) -> int | None:
    """An epoch-microsecond reply as epoch milliseconds."""
    text = text_of(value)
    return None if text is None else int(text) // 1000


def parse_state(name: str, reply: Any) -> GuardState:
    """One entry of guard_state.lua's reply."""
    return GuardState(
        name=name,
        state=CircuitState.from_code(int(reply[0])),
        failures=int(reply[2]),
        cooldown_until_ms=_ms(reply[3]),
        trial_until_ms=_ms(reply[4]),
        next_slot_ms=_ms(reply[5]),
        last_error=text_of(reply[6]),
        last_error_ms=_ms(reply[7]),
        observed_ms=int(reply[1]) // 1000,
    )


