"""Lua scripts: `.lua` package data, called by SHA1 in one round trip, reloaded if Redis lost them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from agent_async.lifecycle import lua_constants
from agent_async.metrics.layout import lua_constants as metrics_constants
from agent_async.store import codec

__all__ = ["LuaScript", "ScriptCall", "load_scripts", "lua_source", "run_script"]

Arg = str | bytes | int | float


# A packed script receives its keys and arguments as one JSON argument, [keys, args], all strings.
_UNPACK = "local KEYS, ARGV = unpack(cjson.decode(ARGV[1]))\n"


@cache
def _read(package: str, name: str) -> str:
    return files(package).joinpath("lua", name).read_text(encoding="utf-8")


def lua_source(package: str, name: str, constants: Mapping[str, str] | None = None) -> str:
    """The text of `<package>/lua/<name>`, its `@NAME@` placeholders filled in from `constants`."""
    text = _read(package, name)
    for placeholder, value in (constants or {}).items():
        text = text.replace(placeholder, value)
    if "@" in "".join(line.split("--", 1)[0] for line in text.splitlines()):
        raise ValueError(f"{package}/lua/{name}: a placeholder was left unfilled")
    return text


# Index entries older than the retention are checked this many at a time (see lib.lua's prune);
# an index every job writes is pruned at every PRUNE_EVERY-th write, that many times as many.
_PRUNE_BATCH = 10
PRUNE_EVERY = 8
# The event stream keeps about this many entries (XADD MAXLEN ~): a late reader replays what is left.
# An entry holds one event, or up to EVENTS_PER_ENTRY of one script call's (lib.lua's send_events):
# 50,000 to 500,000 events, some 5 to 58 MB.
EVENTS_KEPT = 50_000
EVENTS_PER_ENTRY = 10


def store_script(
    name: str | Sequence[str], engine_lua: str, *, events_key: str, metrics_key: str = "", packed: bool = False
) -> LuaScript:
    """A store script: the engine's Lua library, then store/lua/lib.lua, then the script itself
    (`name`, or several files in order: the script's own library first).

    `events_key` is the namespace's event stream and `metrics_key` its metrics hash, written by the
    same scripts as the transitions (so the script text, and its SHA, is per namespace); '' turns
    either off."""
    names = [name] if isinstance(name, str) else name
    body = "\n".join(lua_source("agent_async.store", n) for n in names)
    return with_store_lib(body, engine_lua, events_key=events_key, metrics_key=metrics_key, packed=packed)


def store_lib_constants(*, events_key: str, metrics_key: str = "") -> dict[str, str]:
    """What fills store/lua/lib.lua's placeholders (see store_script for the two keys)."""
    return {
        **lua_constants(), "@PRUNE_BATCH@": str(_PRUNE_BATCH), "@PRUNE_EVERY@": str(PRUNE_EVERY),
        "@EVENTS@": events_key, "@EVENTS_KEPT@": str(EVENTS_KEPT), "@EVENTS_PER_ENTRY@": str(EVENTS_PER_ENTRY),
        **metrics_constants(metrics_key),
    }


def with_store_lib(
    body: str, engine_lua: str, *, events_key: str, metrics_key: str = "", packed: bool = False
) -> LuaScript:
    """`body` after the engine's Lua library and store/lua/lib.lua (see store_script)."""
    constants = store_lib_constants(events_key=events_key, metrics_key=metrics_key)
    lib = lua_source("agent_async.store", "lib.lua", constants)
    return LuaScript(engine_lua + "\n" + lib + "\n" + body, packed=packed)


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A script and its SHA1.

    `packed=True` sends keys and arguments as one JSON argument instead of one argument each:
    on the worker's hot path redis-py's per-argument encoding costs more than the script itself.
    (Keys then go undeclared, which only Redis Cluster would mind; arq does not support it.)
    """

    source: str
    packed: bool = False
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        if self.packed:
            object.__setattr__(self, "source", _UNPACK + self.source)
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())

    def __call__(self, keys: Sequence[Arg], args: Sequence[Arg]) -> ScriptCall:
        return ScriptCall(self, tuple(keys), tuple(args))


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One invocation, built now and sent later: alone (`run_script`) or inside another MULTI."""

    script: LuaScript
    keys: tuple[Arg, ...]
    args: tuple[Arg, ...]

    def argv(self) -> tuple[Arg, ...]:
        """EVALSHA's arguments after the SHA."""
        if self.script.packed:
            return (0, json.dumps(self.texts()))
        return (len(self.keys), *self.keys, *self.args)

    def texts(self) -> list[list[str]]:
        """[keys, args] as text: what a packed script (or a batch of them) decodes."""
        # Most arguments are str already: the type test inline skips a call per argument (an
        # enqueue has about 35, and enqueue_many's rate is bound by its Python per job).
        return [[k if type(k) is str else codec.text(k) for k in self.keys],
                [a if type(a) is str else codec.text(a) for a in self.args]]

    def queue_on(self, pipe: Pipeline) -> None:
        """Queue as EVALSHA: the caller must have loaded the script and handle NOSCRIPT."""
        pipe.execute_command("EVALSHA", self.script.sha, *self.argv())


async def load_scripts(redis: Redis, scripts: Sequence[LuaScript]) -> None:
    """SCRIPT LOAD each script, so that EVALSHA queued inside a MULTI finds it."""
    for script in scripts:
        await redis.script_load(script.source)


async def run_script(redis: Redis, call: ScriptCall) -> Any:
    """EVALSHA, falling back to SCRIPT LOAD once on NOSCRIPT (after a Redis restart or flush)."""
    argv = (call.script.sha, *call.argv())
    try:
        return await redis.execute_command("EVALSHA", *argv)  # type: ignore[no-untyped-call]
    except NoScriptError:
        await redis.script_load(call.script.source)
        return await redis.execute_command("EVALSHA", *argv)  # type: ignore[no-untyped-call]
