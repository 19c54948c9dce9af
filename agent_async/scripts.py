"""Lua scripts: called by SHA1 in one round trip, reloaded if Redis lost them, embeddable in a MULTI."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

__all__ = ["LuaScript", "ScriptCall", "load_scripts", "run_script"]

Arg = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class LuaScript:
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())

    def __call__(self, keys: Sequence[Arg], args: Sequence[Arg]) -> ScriptCall:
        return ScriptCall(self, tuple(keys), tuple(args))


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One invocation, built now and sent later: alone (`run_script`) or inside another MULTI."""

    script: LuaScript
    keys: tuple[Arg, ...]
    args: tuple[Arg, ...]

    def queue_on(self, pipe: Pipeline) -> None:
        """Queue as EVALSHA: the caller must have loaded the script and handle NOSCRIPT."""
        pipe.execute_command("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


async def load_scripts(redis: Redis, scripts: Sequence[LuaScript]) -> None:
    """SCRIPT LOAD each script, so that EVALSHA queued inside a MULTI finds it."""
    for script in scripts:
        await redis.script_load(script.source)


async def run_script(redis: Redis, call: ScriptCall) -> Any:
    """EVALSHA, falling back to SCRIPT LOAD once on NOSCRIPT (after a Redis restart or flush)."""
    argv = (call.script.sha, len(call.keys), *call.keys, *call.args)
    try:
        return await redis.execute_command("EVALSHA", *argv)  # type: ignore[no-untyped-call]
    except NoScriptError:
        await redis.script_load(call.script.source)
        return await redis.execute_command("EVALSHA", *argv)  # type: ignore[no-untyped-call]
