"""The check a connection pool makes before it hands a connection out, without a zero-timeout read.

redis-py 5 checks each connection it takes out of a pool for data left unread or a closed socket
(`can_read_destructive`) by reading under `asyncio.timeout(0)`. On a healthy connection nothing is
there: the read waits, the timeout fires at the next turn of the event loop and cancels it. Every
command sent through a pool pays two turns of the loop and a cancelled read for that (measured: 22
of 105 µs of CPU per GET, docs/performance.md). redis-py 7 checks the buffers instead
(redis/redis-py#4063); arq 0.28 pins redis<6. `check_buffers` gives a client's pool that check.

It looks at what this process has already received: the hiredis reader's buffer, the stream's
buffer, and whether the stream saw the end of the connection. Bytes still in the kernel's socket
buffer that the event loop has not read yet are not seen, as in redis-py 7. Connections without the
hiredis parser keep redis-py's own check.
"""

from __future__ import annotations

from typing import Any

from redis._parsers.hiredis import _AsyncHiredisParser
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

__all__ = ["check_buffers"]


class _BufferCheck(AbstractConnection):
    """Mixed in front of the pool's own connection class (TCP, TLS or Unix socket alike)."""

    async def can_read_destructive(self) -> bool:
        parser = self._parser
        reader: Any = getattr(parser, "_reader", None)  # hiredis.Reader once connected
        stream = getattr(parser, "_stream", None)
        if not isinstance(parser, _AsyncHiredisParser) or not parser._connected or reader is None or stream is None:
            return bool(await super().can_read_destructive())  # type: ignore[no-untyped-call]
        return bool(reader.has_data() or stream.at_eof() or stream._buffer)


# One class per connection class (a pool per client, a few classes in all).
_CHECKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _with_buffer_check(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    if connection_class not in _CHECKED:
        _CHECKED[connection_class] = type(
            f"BufferChecked{connection_class.__name__}", (_BufferCheck, connection_class), {}
        )
    return _CHECKED[connection_class]


def check_buffers(redis: Redis) -> Redis:
    """Give the connections `redis`'s pool makes from now on the buffer check; returns `redis`."""
    pool = redis.connection_pool
    if not issubclass(pool.connection_class, _BufferCheck):
        pool.connection_class = _with_buffer_check(pool.connection_class)
    return redis
