"""run_in_child: run blocking or CPU-bound work in a child process that cancellation can kill."""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

import structlog

from agent_async.errors import AgentError
from agent_async.logs import LogSetup, bound_fields, configure_logging, current_setup

__all__ = ["ChildProcessLost", "RunHandle", "current_run", "run_in_child"]

_T = TypeVar("_T")

# forkserver: forking a clean server process is fast and never copies the worker's event loop,
# sockets or threads into the child (plain fork can deadlock on them).
_MP = multiprocessing.get_context("forkserver")


class ChildProcessLost(AgentError):
    """The child process ended without a result (killed by a signal, or crashed)."""


@dataclass(eq=False)
class RunHandle:
    """One running attempt in a worker: how to stop it, and the child processes it owns."""

    job_id: str
    cancel_requested: bool = False
    children: set[BaseProcess] = field(default_factory=set)
    # Set by the runner while it waits on the attempt; wakes it up.
    waker: Callable[[], None] | None = None
    # Where report_progress() goes (agent_async.worker.progress.ProgressReporter), if anywhere.
    progress: Any = None
    # The attempt has returned (its outcome may still be on its way to Redis: it stays tracked).
    ended: bool = False

    def request_cancel(self) -> None:
        self.cancel_requested = True
        if self.waker is not None:
            self.waker()

    def live_children(self) -> list[BaseProcess]:
        return [child for child in self.children if child.is_alive()]

    def kill_children(self) -> int:
        """SIGKILL every child still alive and reap it; returns how many were killed."""
        killed = 0
        for child in self.live_children():
            child.kill()
            # SIGKILL cannot be caught: the join is immediate, and leaves no zombie behind.
            child.join(timeout=1)
            killed += 1
        self.children.clear()
        return killed


# The attempt the current task belongs to; set by the runner around Job.process().
current_run: ContextVar[RunHandle | None] = ContextVar("agent_async_current_run", default=None)


@dataclass(frozen=True, slots=True)
class _ChildLogging:
    """The parent's log setup and the run's bound fields, repeated in the child: a fresh
    interpreter, whose lines would otherwise have neither."""

    setup: LogSetup
    fields: dict[str, Any]


def _child_main(
    conn: Connection,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    logs: _ChildLogging | None = None,
) -> None:
    # The worker's SIGINT (Ctrl-C in a terminal) must not kill children before the job decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if logs is not None:
        configure_logging(logs.setup.log_format, level=logs.setup.level)
        structlog.contextvars.bind_contextvars(**logs.fields)
    try:
        outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
    except BaseException as exc:  # sent back to the parent, which re-raises it
        outcome = (False, exc)
    try:
        conn.send(outcome)
    finally:
        conn.close()


async def run_in_child(fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """Run `fn(*args, **kwargs)` in a fresh child process and return its result.

    `fn`, its arguments and its result must be picklable (a module-level function). Cancelling
    the awaiting task sends SIGTERM to the child; a job's phase-2 stop (cancel grace or hard time
    limit exceeded) sends SIGKILL. Either way the child never outlives the attempt.
    """
    loop = asyncio.get_running_loop()
    receiver, sender = _MP.Pipe(duplex=False)
    setup = current_setup()
    logs = _ChildLogging(setup, bound_fields()) if setup is not None else None
    child = _MP.Process(target=_child_main, args=(sender, fn, args, kwargs, logs), daemon=True)
    child.start()
    sender.close()
    handle = current_run.get()
    if handle is not None:
        handle.children.add(child)
    ready: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(receiver.fileno(), on_readable)
    try:
        await ready
        try:
            ok, value = await asyncio.to_thread(receiver.recv)
        except EOFError:
            await asyncio.to_thread(child.join)
            raise ChildProcessLost(f"child process ended without a result (exit code {child.exitcode})") from None
        await asyncio.to_thread(child.join)
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]
    except asyncio.CancelledError:
        if child.is_alive():
            child.terminate()
        raise
    finally:
        loop.remove_reader(receiver.fileno())
        receiver.close()
        if handle is not None and not child.is_alive():
            handle.children.discard(child)
