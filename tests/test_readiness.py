"""The pool's check of a connection before it hands it out (store/readiness.py): no wait on the
event loop, and still a connection left with unread data or closed by the server is replaced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from agent_async import Agent
from agent_async.engine.hooks import Hooks
from agent_async.store import check_buffers
from tests.conftest import REDIS_URL


@pytest.fixture
async def checked() -> AsyncIterator[Redis]:
    client = check_buffers(Redis.from_url(REDIS_URL))
    yield client
    await client.aclose()


async def _taken(client: Redis) -> AbstractConnection:
    conn = await client.connection_pool.get_connection()
    await conn.send_command("PING")
    assert await conn.read_response() == b"PONG"
    return conn


@pytest.mark.parametrize("buffer_check", [True, False], ids=["buffer_check", "redis_py_check"])
async def test_the_check_of_a_healthy_connection_does_not_wait_for_the_loop(buffer_check: bool) -> None:
    client = Redis.from_url(REDIS_URL)
    if buffer_check:
        check_buffers(client)
    try:
        conn = await _taken(client)
        probe = conn.can_read_destructive()
        try:
            # One step of the coroutine: the buffer check is done (StopIteration, nothing to read);
            # redis-py's own suspends on its zero-timeout read (the control).
            with pytest.raises(StopIteration) if buffer_check else _suspends():
                probe.send(None)
        finally:
            probe.close()
        await client.connection_pool.release(conn)
    finally:
        await client.aclose()


class _suspends:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, *_: object) -> bool:
        assert exc_type is None, "redis-py's check finished without waiting"
        return False


async def test_a_connection_left_with_an_unread_reply_is_replaced(checked: Redis, namespace: str) -> None:
    await checked.set(f"{namespace}:k", "fresh")
    conn = await _taken(checked)
    await conn.send_command("SET", f"{namespace}:other", "x")  # its OK is never read
    await checked.connection_pool.release(conn)
    await asyncio.sleep(0.05)  # the reply reaches this process's buffers
    # The pool sees the stale reply and reconnects: the GET gets its own answer, not that OK.
    assert await checked.get(f"{namespace}:k") == b"fresh"


async def test_a_connection_the_server_closed_is_replaced(checked: Redis, redis: Redis) -> None:
    conn = await _taken(checked)
    await conn.send_command("CLIENT", "ID")
    client_id = await conn.read_response()
    await checked.connection_pool.release(conn)
    await redis.execute_command("CLIENT", "KILL", "ID", client_id)  # type: ignore[no-untyped-call]
    await asyncio.sleep(0.05)  # the end of the connection reaches this process
    assert await checked.ping() is True


async def test_the_agent_and_the_workers_pool_get_the_buffer_check(agent: Agent, redis: Redis) -> None:
    class_name = type(await _taken(agent.job_store.redis)).__name__
    assert class_name.startswith("BufferChecked")
    arq_pool = Redis.from_url(REDIS_URL)
    try:
        hooks: Hooks = agent.engine._hooks(agent.worker, lambda: agent.scheduler)
        await hooks.on_startup({"redis": arq_pool})
        assert type(await _taken(arq_pool)).__name__.startswith("BufferChecked")
        await hooks.on_shutdown({"redis": arq_pool})
    finally:
        await arq_pool.aclose()
