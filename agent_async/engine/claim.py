"""The batch claim: one script call takes as many due jobs as a worker has free slots, and says
what the worker waits for next (arq's claim is four round trips per job: WATCH, checks, MULTI)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arq.constants import in_progress_key_prefix

from agent_async.engine.wakeup import Idle, Wait
from agent_async.engine.wire import WAKE_CAP, WAKE_SUFFIX, WAKE_TTL_MS
from agent_async.lifecycle import now_ms
from agent_async.store import LuaScript, ScriptCall, lua_source

__all__ = ["ENGINE_LUA", "SERVER_NOW", "Claimed", "claim_call", "next_wait", "parse_claim"]

# The engine's Lua library (queue.lua), its constants filled in from wire.py.
ENGINE_LUA = lua_source(
    "agent_async.engine", "queue.lua",
    {"@WAKE_CAP@": str(WAKE_CAP), "@WAKE_TTL_MS@": str(WAKE_TTL_MS), "@WAKE_SUFFIX@": WAKE_SUFFIX},
)
_CLAIM_BATCH = LuaScript(ENGINE_LUA + "\n" + lua_source("agent_async.engine", "claim_batch.lua"), packed=True)
# claim_batch.lua's first reply element, when it is not the score of the next deferred job.
_MORE_DUE = -1
_READ_LIMIT_FULL = -2
# The time argument that makes the script read Redis's clock when it runs (a claim sent before a
# blocking wait runs only when the wait ends).
SERVER_NOW = "now"


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claim took: (engine job id, score) pairs, and claim_batch.lua's `next` (the next
    deferred job's score, 0 if none, or _MORE_DUE / _READ_LIMIT_FULL; next_wait reads it)."""

    jobs: list[tuple[str, int]]
    next_ms: int


def claim_call(
    queue: str, wake_key: str, *, wanted: int, ttl_ms: int, read_limit: int, at: int | str | None = None
) -> ScriptCall:
    """The claim of up to `wanted` due jobs, due as of `at` (now by default; SERVER_NOW: Redis's
    clock when the script runs)."""
    return _CLAIM_BATCH(
        [queue, wake_key], [now_ms() if at is None else at, ttl_ms, in_progress_key_prefix, wanted, read_limit]
    )


def parse_claim(reply: Sequence[bytes | int]) -> Claimed:
    jobs = [(bytes(reply[i]).decode(), int(float(reply[i + 1]))) for i in range(1, len(reply), 2)]
    return Claimed(jobs, int(reply[0]))


def next_wait(claimed: Claimed, *, slots_full: bool) -> Wait | None:
    """What the worker waits for after a claim."""
    if slots_full:
        return Wait(Idle.SLOT)
    if claimed.next_ms == _MORE_DUE:
        return None
    if claimed.next_ms == _READ_LIMIT_FULL:
        return Wait(Idle.POLL)
    return Wait(Idle.WORK, claimed.next_ms or None)
