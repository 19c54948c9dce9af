"""Lua scripts: run_script's NOSCRIPT fallback, packed arguments, queue_on in a MULTI, lua_source, the sha."""

from __future__ import annotations

import hashlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_async.store.scripts import (
    LuaScript,
    ScriptCall,
    load_scripts,
    lua_source,
    run_script,
    store_lib_constants,
)

# Returns its keys and arguments joined, and how many it got of each.
ECHO_SOURCE = "return {KEYS[1] .. '|' .. ARGV[1], #KEYS, #ARGV, KEYS[2] or false, ARGV[2] or false}"
# The text of a packed script starts with this line (it unpacks the one JSON argument).
UNPACK_PRELUDE = "local KEYS, ARGV = unpack(cjson.decode(ARGV[1]))\n"


def unique_source(body: str) -> str:
    """A source of this test's own: a script cached by another test cannot hide a missing load."""
    return f"-- {uuid.uuid4().hex}\n{body}"


@pytest.fixture
def lua_package(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A throw-away package with a `lua/` folder, importable by name (lua_source reads package data)."""
    name = f"test_scripts_pkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / name / "lua").mkdir(parents=True)
    (tmp_path / name / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path / name / "lua", name
    sys.path.remove(str(tmp_path))
    sys.modules.pop(name, None)


# -- run_script ------------------------------------------------------------------------------------


async def test_run_script_loads_a_script_redis_does_not_know(redis: Redis, namespace: str) -> None:
    script = LuaScript(unique_source(ECHO_SOURCE))
    await redis.script_flush()
    assert await redis.script_exists(script.sha) == [False]

    reply = await run_script(redis, script([f"{namespace}:k"], ["a"]))

    assert reply == [f"{namespace}:k|a".encode(), 1, 1, None, None]
    assert await redis.script_exists(script.sha) == [True]


async def test_run_script_survives_a_flush_between_calls(redis: Redis, namespace: str) -> None:
    script = LuaScript(unique_source("return redis.call('INCR', KEYS[1])"))
    key = f"{namespace}:counter"
    assert await run_script(redis, script([key], [])) == 1
    await redis.script_flush()
    assert await run_script(redis, script([key], [])) == 2


async def test_run_script_propagates_script_errors(redis: Redis) -> None:
    from redis.exceptions import ResponseError

    script = LuaScript(unique_source("return redis.error_reply('nope: ' .. ARGV[1])"))
    with pytest.raises(ResponseError, match="nope: why"):
        await run_script(redis, script([], ["why"]))


async def test_plain_script_receives_keys_and_args_as_given(redis: Redis, namespace: str) -> None:
    script = LuaScript(unique_source(ECHO_SOURCE))
    reply = await run_script(redis, script([f"{namespace}:k1", f"{namespace}:k2"], ["a", 7]))
    assert reply == [f"{namespace}:k1|a".encode(), 2, 2, f"{namespace}:k2".encode(), b"7"]


# -- packed scripts --------------------------------------------------------------------------------


async def test_packed_script_receives_keys_and_args_through_the_json_argument(redis: Redis, namespace: str) -> None:
    script = LuaScript(unique_source(ECHO_SOURCE), packed=True)
    call = script([f"{namespace}:k1", f"{namespace}:k2"], ["a", 7])

    # On the wire: no declared key, one JSON argument.
    numkeys, packed = call.argv()
    assert numkeys == 0 and isinstance(packed, str)

    reply = await run_script(redis, call)
    assert reply == [f"{namespace}:k1|a".encode(), 2, 2, f"{namespace}:k2".encode(), b"7"]


async def test_packed_and_plain_scripts_see_the_same_arguments(redis: Redis, namespace: str) -> None:
    body = unique_source("return {KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], type(ARGV[2])}")
    keys = [f"{namespace}:ключ"]
    args = ["zoë 🎉 日本語", 42, 1.5, '{"r":"ü","q":"\\"x\\""}']
    plain = await run_script(redis, LuaScript(body)(keys, args))
    packed = await run_script(redis, LuaScript(body, packed=True)(keys, args))
    assert packed == plain
    assert packed[1].decode() == "zoë 🎉 日本語"
    assert packed[2] == b"42" and packed[5] == b"string"
    assert packed[4].decode() == '{"r":"ü","q":"\\"x\\""}'


async def test_packed_script_receives_bytes_as_their_text(redis: Redis) -> None:
    """bytes keys and arguments reach a packed script as the text they hold, as with a plain one
    (not as Python's repr "b'...'")."""
    body = "return {KEYS[1], ARGV[1]}"
    plain = await run_script(redis, LuaScript(body)([b"k\xc3\xa9"], [b"v"]))
    packed = await run_script(redis, LuaScript(body, packed=True)([b"k\xc3\xa9"], [b"v"]))
    assert packed == plain == ["ké".encode(), b"v"]


async def test_packed_script_with_no_keys_or_args(redis: Redis) -> None:
    script = LuaScript(unique_source("return {#KEYS, #ARGV}"), packed=True)
    assert await run_script(redis, script([], [])) == [0, 0]


def test_plain_argv_is_numkeys_keys_then_args() -> None:
    call = LuaScript("return 1")(["k1", "k2"], ["a", 3])
    assert isinstance(call, ScriptCall)
    assert call.keys == ("k1", "k2") and call.args == ("a", 3)
    assert call.argv() == (2, "k1", "k2", "a", 3)


# -- the sha ---------------------------------------------------------------------------------------


def test_sha_is_the_sha1_of_the_source() -> None:
    source = unique_source("return 1")
    script = LuaScript(source)
    assert script.source == source
    assert script.sha == hashlib.sha1(source.encode()).hexdigest()


def test_packed_sha_covers_the_unpack_prelude() -> None:
    source = unique_source("return 1")
    packed = LuaScript(source, packed=True)
    assert packed.source == UNPACK_PRELUDE + source
    assert packed.sha == hashlib.sha1((UNPACK_PRELUDE + source).encode()).hexdigest()
    assert packed.sha != LuaScript(source).sha


async def test_redis_computes_the_same_sha(redis: Redis) -> None:
    """EVALSHA finds what SCRIPT LOAD stored only if both agree on the sha."""
    source = unique_source("return 'é'")
    for script in (LuaScript(source), LuaScript(source, packed=True)):
        assert await redis.script_load(script.source) == script.sha


# -- queue_on inside a MULTI -----------------------------------------------------------------------


async def test_queue_on_executes_inside_a_multi_after_load_scripts(redis: Redis, namespace: str) -> None:
    incr = LuaScript(unique_source("return redis.call('INCRBY', KEYS[1], ARGV[1])"))
    packed = LuaScript(unique_source(ECHO_SOURCE), packed=True)
    key = f"{namespace}:multi"
    await redis.script_flush()

    await load_scripts(redis, [incr, packed])
    assert await redis.script_exists(incr.sha, packed.sha) == [True, True]

    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(key, 10)
        incr([key], [5]).queue_on(pipe)
        packed([key], ["x"]).queue_on(pipe)
        pipe.get(key)
        replies = await pipe.execute()

    assert replies == [True, 15, [f"{key}|x".encode(), 1, 1, None, None], b"15"]


async def test_queue_on_needs_the_script_loaded(redis: Redis, namespace: str) -> None:
    """queue_on does not load: without load_scripts the MULTI fails with NOSCRIPT (the caller's job)."""
    from redis.exceptions import NoScriptError

    script = LuaScript(unique_source("return 1"))
    await redis.script_flush()
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(f"{namespace}:k", 1)
        script([], []).queue_on(pipe)
        with pytest.raises(NoScriptError, match="No matching script"):
            await pipe.execute()


# -- lua_source ------------------------------------------------------------------------------------


def test_lua_source_fills_placeholders(lua_package: tuple[Path, str]) -> None:
    folder, package = lua_package
    (folder / "fill.lua").write_text("-- @A@ and @B@ are filled in\nreturn {'@A@', @B@}\n", encoding="utf-8")

    text = lua_source(package, "fill.lua", {"@A@": "alpha", "@B@": "42"})

    assert "return {'alpha', 42}" in text
    assert "@" not in text


def test_lua_source_refuses_an_unfilled_placeholder(lua_package: tuple[Path, str]) -> None:
    folder, package = lua_package
    (folder / "left.lua").write_text("return {'@A@', @B@}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"left\.lua: a placeholder was left unfilled"):
        lua_source(package, "left.lua", {"@A@": "alpha"})
    with pytest.raises(ValueError, match="placeholder"):
        lua_source(package, "left.lua")


def test_lua_source_ignores_at_signs_in_comments(lua_package: tuple[Path, str]) -> None:
    folder, package = lua_package
    (folder / "comment.lua").write_text("-- mail me@example.com, @NAME@ is documented here\nreturn 1\n")
    assert lua_source(package, "comment.lua").endswith("return 1\n")


def test_lua_source_of_a_file_without_placeholders_is_its_text(lua_package: tuple[Path, str]) -> None:
    folder, package = lua_package
    (folder / "plain.lua").write_text("return 'ü'\n", encoding="utf-8")
    assert lua_source(package, "plain.lua") == "return 'ü'\n"


def test_library_lua_needs_its_constants() -> None:
    """lib.lua's placeholders come from agent_async.lifecycle: without them it is refused."""
    with pytest.raises(ValueError, match=r"lib\.lua"):
        lua_source("agent_async.store", "lib.lua")
    constants = store_lib_constants(events_key="ns:events", metrics_key="ns:metrics")
    filled = lua_source("agent_async.store", "lib.lua", constants)
    assert "@TERMINAL@" not in filled and "@PRUNE_BATCH@" not in filled and "'ns:events'" in filled


def test_lua_source_of_a_missing_file_is_an_error(lua_package: tuple[Path, str]) -> None:
    _, package = lua_package
    with pytest.raises(FileNotFoundError):
        lua_source(package, "absent.lua")
