"""The batch claim: one script call takes as many due jobs as a worker has free slots, and says
what the worker waits for next (arq's claim is four round trips per job: WATCH, checks, MULTI)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix

from agent_async.engine.wakeup import Idle, Wait
from agent_async.engine.wire import WAKE_CAP, WAKE_SUFFIX, WAKE_TTL_MS
from agent_async.lifecycle import now_ms
from agent_async.store import LuaScript, ScriptCall, lua_source

__all__ = [
    "ARQ_MARK", "CLAIM_LIB", "CLAIM_WITH_PICKUP", "ENGINE_LUA", "PICKUP_LIB", "SERVER_NOW", "Claimed", "PickedUp",
    "Pickup", "claim_call", "claim_in_finish", "mark_in_finish", "next_wait", "parse_claim",
]

# The engine's Lua library (queue.lua), its constants filled in from wire.py.
ENGINE_LUA = lua_source(
    "agent_async.engine", "queue.lua",
    {"@WAKE_CAP@": str(WAKE_CAP), "@WAKE_TTL_MS@": str(WAKE_TTL_MS), "@WAKE_SUFFIX@": WAKE_SUFFIX,
     "@JOB_PREFIX@": job_key_prefix},
)
# The claim as a function (claim_lib.lua), then the script that calls it (claim_batch.lua).
CLAIM_LIB = lua_source("agent_async.engine", "claim_lib.lua")
_CLAIM_BODY = CLAIM_LIB + "\n" + lua_source("agent_async.engine", "claim_batch.lua")
# arq's run_job keeps a job's tries this long (its literal, arq 0.28 worker.py).
_ARQ_RETRY_TTL_S = 88400
# The claim that also picks each job up (pickup.lua): the body a store builds into a script with
# its own library in front (JobStore.starting_in), since the pickup starts the job too.
PICKUP_LIB = lua_source(
    "agent_async.engine", "pickup.lua",
    {"@RETRY_PREFIX@": retry_key_prefix, "@RETRY_TTL_S@": str(_ARQ_RETRY_TTL_S)},
)
CLAIM_WITH_PICKUP = PICKUP_LIB + "\n" + _CLAIM_BODY
_CLAIM_BATCH = LuaScript(
    ENGINE_LUA + "\n" + lua_source("agent_async.engine", "no_pickup.lua") + "\n" + _CLAIM_BODY, packed=True
)
# claim_batch.lua's first reply element, when it is not the score of the next deferred job.
_MORE_DUE = -1
_READ_LIMIT_FULL = -2
# What arq writes in a job's in-progress key, and the mark of a claim made without a name of its own.
ARQ_MARK = "1"
# The time argument that makes the script read Redis's clock when it runs (a claim sent before a
# blocking wait runs only when the wait ends).
SERVER_NOW = "now"


@dataclass(slots=True)
class PickedUp:
    """A claimed job that the claim also picked up (pickup.lua): the replies arq's pickup
    transaction would have had (the job, its tries, whether it was aborted), the START's reply,
    and whether arq's pickup has been answered with them yet."""

    job: bytes | None
    tries: int
    aborted: int
    start: Any
    answered: bool = False


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claim took: (engine job id, score) pairs, the pickups it did by engine job id, and
    claim_batch.lua's `next` (the next deferred job's score, 0 if none, or _MORE_DUE /
    _READ_LIMIT_FULL; next_wait reads it)."""

    jobs: list[tuple[str, int]]
    next_ms: int
    picked: dict[str, PickedUp] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pickup:
    """The claim that picks up what it claims: its script (built by the store, CLAIM_WITH_PICKUP)
    and pickup.lua's arguments (this namespace's engine id prefix, the store's part
    (JobStore.starting_in), arq's abort set or '')."""

    script: LuaScript
    args: tuple[str | int, ...]


def claim_call(
    queue: str, wake_key: str, *, wanted: int, ttl_ms: int, read_limit: int, at: int | str | None = None,
    pickup: Pickup | None = None, mark: str = ARQ_MARK, held: int = 0,
) -> ScriptCall:
    """The claim of up to `wanted` due jobs, due as of `at` (now by default; SERVER_NOW: Redis's
    clock when the script runs); with `pickup`, each of this namespace's jobs is picked up too.
    Their in-progress keys hold `mark` (engine/hand_backs.py). `held`: how many jobs the worker
    runs, which sit at the head of the queue until they finish (the claim's first page reads past
    them: claim_lib.lua)."""
    args = [now_ms() if at is None else at, ttl_ms, in_progress_key_prefix, mark, wanted, read_limit, held]
    if pickup is None:
        return _CLAIM_BATCH([queue, wake_key], args)
    return pickup.script([queue, wake_key], [*args, *pickup.args])


def claim_in_finish(
    wanted: int, *, ttl_ms: int, read_limit: int, pickup: Pickup, mark: str = ARQ_MARK, held: int = 0
) -> tuple[int, tuple[str | int, ...]]:
    """The claim a finish call makes (finish_batch.lua's arguments after the runs): `wanted` jobs,
    claimed and picked up as `claim_call` does (`pickup`'s arguments; `held`: the jobs the worker
    runs besides the runs this call ends)."""
    return wanted, (ttl_ms, in_progress_key_prefix, mark, read_limit, held, *pickup.args)


def mark_in_finish(claim_args: Sequence[str | int]) -> str:
    """The mark of a claim made with a finish (`claim_in_finish`'s arguments)."""
    return str(claim_args[2])


# claim_lib.lua's reply holds this many values per job (pickup.lua's pickup_all): engine id,
# score, picked up (1/0), the job's record, tries, aborted, then the START's reply (three values).
_STRIDE = 9


def parse_claim(reply: Sequence[Any]) -> Claimed:
    jobs, picked = [], {}
    for i in range(1, len(reply), _STRIDE):
        engine_id = bytes(reply[i]).decode()
        jobs.append((engine_id, int(float(reply[i + 1]))))
        if reply[i + 2] == 1:
            code, *rest = reply[i + 6:i + 9]
            # The START's reply as start.lua gives it (None: the start failed in Redis).
            start = None if code is None else [code, *(v for v in rest if v is not None)]
            picked[engine_id] = PickedUp(reply[i + 3], int(reply[i + 4]), int(reply[i + 5]), start)
    return Claimed(jobs, int(reply[0]), picked)


def next_wait(claimed: Claimed, *, slots_full: bool) -> Wait | None:
    """What the worker waits for after a claim."""
    if slots_full:
        return Wait(Idle.SLOT)
    if claimed.next_ms == _MORE_DUE:
        return None
    if claimed.next_ms == _READ_LIMIT_FULL:
        return Wait(Idle.POLL)
    return Wait(Idle.WORK, claimed.next_ms or None)
