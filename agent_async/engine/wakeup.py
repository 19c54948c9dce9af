"""Push wake-up: an idle fast worker blocks in Redis on its queue's wake list instead of polling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ResponseError

from agent_async.engine.wire import WAKE_CAP, WAKE_TTL_MS
from agent_async.store import ScriptCall

__all__ = ["Idle", "Wait", "Waker", "Woken", "give_back_claim", "queue_wake", "wait_set"]

logger = logging.getLogger(__name__)

# Redis times out a blocked client only on its own clock tick (hz=10: up to 100 ms late), so a
# wait that must end on time (a deferred job, a cron tick) is ended by this process instead, with
# CLIENT UNBLOCK; Redis's own timeout then sits this far later, as a backstop only.
_BACKSTOP_S = 0.5
# A wait cancelled (the worker stops) reads this long for the replies Redis may already have sent:
# if the claim behind the pop ran, the jobs it took are handed back instead of left to recovery.
_SALVAGE_S = 0.05


class Idle(Enum):
    """What the fast worker waits for before its next claim."""

    SLOT = "slot"  # every slot is busy: a running job to end
    WORK = "work"  # nothing claimable: a wake-up token, or the next deferred job's time
    POLL = "poll"  # the read limit was full of jobs claimed elsewhere: arq's polling pause
    STOP = "stop"  # stopping: no more claims, only arq's cancel to come


@dataclass(frozen=True, slots=True)
class Woken:
    """How a wait ended: by a token (else its timeout or an unblock), and the reply of the script
    sent behind it (None if none was sent or it failed)."""

    token: bool
    then: Any = None


@dataclass(frozen=True, slots=True)
class Wait:
    kind: Idle
    # Wall-clock ms of the next deferred job (WORK), if any.
    until_ms: int | None = None


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `event`; whether it is set.

    Not asyncio.wait_for: on Python 3.11 it returns when the event is set in the loop turn a cancel
    lands in, swallowing the cancel (gh-86296). arq's SIGTERM does just that to the worker's wait
    for a slot (the jobs it cancels free their slots), and the worker then never stopped."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()


def queue_wake(pipe: Pipeline, wake_key: str) -> None:
    """Queue one wake-up token on a pipeline (queue.lua's engine_wake, as plain commands, for
    arq's finish transaction where an EVALSHA could fail alone with NOSCRIPT)."""
    pipe.lpush(wake_key, "1")
    pipe.ltrim(wake_key, 0, WAKE_CAP - 1)
    pipe.pexpire(wake_key, WAKE_TTL_MS)


async def give_back_claim(redis: Redis, claim_key: str, wake_key: str) -> None:
    """Make a claimed job claimable again (a worker hands back a job it will not run) and wake a
    worker for it: an idle one would otherwise notice it only at the end of its longest block.
    (Recovery's release of a lost worker's claim is release_claim.lua: it checks the state first;
    a hand-back has just set it, and a cron tick has none.)"""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.delete(claim_key)
        queue_wake(pipe, wake_key)
        await pipe.execute()


class Waker:
    """One dedicated connection blocked in BLPOP on the wake list while the worker is idle.

    Its own connection (taken out of the worker's pool for as long as the worker runs): a blocked
    connection can carry nothing else. Any error or cancel mid-wait drops it (its reply would
    otherwise be read as the next command's), and the next wait connects again.
    """

    def __init__(self, redis: Redis, wake_key: str) -> None:
        self._redis = redis
        self._wake_key = wake_key
        self._conn: AbstractConnection | None = None
        self._client_id: int | None = None
        self._unblocks: set[asyncio.Task[Any]] = set()
        # Replies of scripts sent behind a wait that was cancelled after they ran (see _salvage).
        self.salvaged: list[Any] = []

    async def wait(self, timeout_s: float, *, on_time: bool, then: ScriptCall | None = None) -> Woken:
        """Block until a token arrives or `timeout_s` passes.

        `on_time`: the wait must not overrun (Redis's own timeout may be 100 ms late).
        `then`: a script sent behind the BLPOP in the same write. Redis runs a blocked client's
        next command as soon as the block ends, so the script (the worker's claim) runs one
        round trip earlier than if it were sent after the wake-up.
        """
        conn = await self._connection()
        loop = asyncio.get_running_loop()
        server_timeout_s = timeout_s + _BACKSTOP_S if on_time else timeout_s
        timer = loop.call_later(timeout_s, self._unblock) if on_time else None
        commands: list[tuple[Any, ...]] = [("BLPOP", self._wake_key, f"{max(server_timeout_s, 0.001):.3f}")]
        if then is not None:
            commands.append(("EVALSHA", then.script.sha, *then.argv()))
        try:
            await conn.send_packed_command(conn.pack_commands(commands))
            reply = await conn.read_response()
        except BaseException as exc:
            try:
                if isinstance(exc, asyncio.CancelledError) and then is not None:
                    await self._salvage(conn, replies=2)
            finally:
                await self._drop()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        woken = Woken(token=reply is not None)
        if then is None:
            return woken
        try:
            return Woken(token=woken.token, then=await conn.read_response())
        except ResponseError as exc:
            # The script failed in Redis (NOSCRIPT after a restart, say): the connection is in step
            # (the error was its reply); the worker sends its claim the usual way.
            logger.debug("script behind the wake-up failed: %s", exc)
            return woken
        except BaseException as exc:
            try:
                if isinstance(exc, asyncio.CancelledError):
                    await self._salvage(conn, replies=1)
            finally:
                await self._drop()
            raise

    async def _salvage(self, conn: AbstractConnection, *, replies: int) -> None:
        """The wait was cancelled with `replies` replies unread, the last the script's. If the pop
        had ended, Redis has run the script (the claim, which also started its jobs) and sent or is
        sending both: read them briefly and keep the script's, so the worker can hand its jobs back.
        If the pop is still blocked, nothing comes and the script never runs."""
        try:
            async with asyncio.timeout(_SALVAGE_S):
                for _ in range(replies - 1):
                    await conn.read_response()  # the pop's: a token, or its timeout (the script ran too)
                self.salvaged.append(await conn.read_response())
        except Exception as exc:  # nothing arrived in time, or the connection is gone
            logger.debug("nothing to salvage from a cancelled wait: %r", exc)

    async def close(self) -> None:
        for task in list(self._unblocks):
            task.cancel()
        await self._drop()

    async def _connection(self) -> AbstractConnection:
        if self._conn is None:
            self._conn = await self._redis.connection_pool.get_connection()
        if not self._conn.is_connected or self._client_id is None:
            await self._conn.connect()
            await self._conn.send_command("CLIENT", "ID")
            self._client_id = int(await self._conn.read_response())
        return self._conn

    def _unblock(self) -> None:
        client_id = self._client_id
        if client_id is None:
            return
        task = asyncio.ensure_future(self._send_unblock(client_id))
        self._unblocks.add(task)
        task.add_done_callback(self._unblocks.discard)

    async def _send_unblock(self, client_id: int) -> None:
        # If the wait already ended, CLIENT UNBLOCK finds no blocked client and does nothing; if
        # Redis is unreachable, the backstop timeout ends the wait instead.
        with contextlib.suppress(Exception):
            await self._redis.execute_command("CLIENT", "UNBLOCK", client_id)  # type: ignore[no-untyped-call]

    async def _drop(self) -> None:
        conn, self._conn, self._client_id = self._conn, None, None
        if conn is None:
            return
        with contextlib.suppress(Exception):
            await conn.disconnect()
        with contextlib.suppress(Exception):
            await self._redis.connection_pool.release(conn)
