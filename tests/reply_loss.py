"""A TCP proxy in front of the real Redis that can lose a reply: the command reaches Redis and runs,
then the client's connection is cut before the reply gets back. That is what a Redis shutdown (or
a network cut) right after a write looks like to the caller, who cannot tell whether it ran.
Made here because no Redis setting does it on cue; everything else in front of it is real."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

__all__ = ["ReplyLosingProxy", "reply_losing_proxy"]

_CHUNK_BYTES = 65536


class ReplyLosingProxy:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._db_path = parts.path or "/0"
        self._server: asyncio.Server | None = None
        self._marker: bytes | None = None
        self._losses_left = 0
        self.lost = 0
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}{self._db_path}"

    def lose_reply_to(self, marker: bytes, *, times: int = 1) -> None:
        """The next `times` commands whose bytes hold `marker` run in Redis; their replies are lost."""
        self._marker, self._losses_left = marker, times

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in self._pumps:
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self._upstream)
        cut = asyncio.Event()
        up = asyncio.ensure_future(self._to_redis(client_r, server_w, cut))
        down = asyncio.ensure_future(self._to_client(server_r, client_w, cut))
        self._pumps.update((up, down))
        try:
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
                self._pumps.discard(task)
            for writer in (client_w, server_w):
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _to_redis(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut: asyncio.Event) -> None:
        while chunk := await reader.read(_CHUNK_BYTES):
            if self._marker is not None and self._losses_left > 0 and self._marker in chunk:
                self._losses_left -= 1
                cut.set()  # the reply to this one never reaches the client
            writer.write(chunk)
            await writer.drain()

    async def _to_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut: asyncio.Event) -> None:
        while chunk := await reader.read(_CHUNK_BYTES):
            if cut.is_set():
                self.lost += 1
                return  # Redis answered; the connection is cut before the answer is passed on
            writer.write(chunk)
            await writer.drain()


@asynccontextmanager
async def reply_losing_proxy(upstream_url: str) -> AsyncIterator[ReplyLosingProxy]:
    proxy = ReplyLosingProxy(upstream_url)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
