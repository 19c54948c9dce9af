"""run_in_child and RunHandle: blocking work in a child process that cancellation can kill.

The functions handed to run_in_child live at module level: the forkserver child unpickles them by
importing this module.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent_async import AgentError, ChildProcessLost, run_in_child
from agent_async.worker.child import RunHandle, current_run

pytestmark = pytest.mark.slow


class ChildError(Exception):
    """An exception of the test's own, raised in the child and re-raised in the parent."""


# -- functions run in the child --------------------------------------------------------------------


def add(a: int, b: int, *, times: int = 1) -> int:
    return (a + b) * times


def whoami() -> int:
    return os.getpid()


def fail(message: str) -> None:
    raise ChildError(message)


def kill_myself(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(10)  # pragma: no cover - the signal ends the process first


def exit_silently(code: int) -> None:
    os._exit(code)


def survive_sigint() -> str:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    return "survived"


def sleep_forever(marker_path: str, *, ignore_sigterm: bool = False) -> None:
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(marker_path, "w") as marker:
        marker.write(str(os.getpid()))
    while True:
        time.sleep(0.01)


# -- helpers ---------------------------------------------------------------------------------------


def read_pid(marker: Path) -> int | None:
    text = marker.read_text() if marker.exists() else ""
    return int(text) if text else None


async def child_pid(marker: Path, *, timeout_s: float = 10.0) -> int:
    """The pid the child wrote once it is running (its start-up done)."""
    deadline = time.monotonic() + timeout_s
    while (pid := read_pid(marker)) is None:
        assert time.monotonic() < deadline, "the child never started"
        await asyncio.sleep(0.01)
    return pid


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    _, alive = psutil.wait_procs([process], timeout=timeout_s)
    return not alive


def start_under(handle: RunHandle, coro: Any) -> asyncio.Task[Any]:
    """Start `coro` as a task that sees `handle` as its current run (as the runner does)."""
    token = current_run.set(handle)
    try:
        return asyncio.create_task(coro)
    finally:
        current_run.reset(token)


# -- results and errors ----------------------------------------------------------------------------


async def test_returns_the_functions_result() -> None:
    assert await run_in_child(add, 2, 3) == 5
    assert await run_in_child(add, 2, 3, times=4) == 20


async def test_runs_in_another_process() -> None:
    pid = await run_in_child(whoami)
    assert pid != os.getpid()
    assert gone(pid), "the child is reaped once it returned"


async def test_reraises_the_childs_exception() -> None:
    with pytest.raises(ChildError, match=r"^bad input$"):
        await run_in_child(fail, "bad input")


async def test_child_killed_by_a_signal_is_lost() -> None:
    with pytest.raises(ChildProcessLost, match=r"exit code -9\)"):
        await run_in_child(kill_myself, signal.SIGKILL)


async def test_child_exiting_without_a_result_is_lost() -> None:
    with pytest.raises(ChildProcessLost, match=r"ended without a result \(exit code 3\)"):
        await run_in_child(exit_silently, 3)
    assert issubclass(ChildProcessLost, AgentError)


async def test_child_ignores_sigint() -> None:
    """Ctrl-C meant for the worker does not kill the job's child."""
    assert await run_in_child(survive_sigint) == "survived"


# -- cancellation ----------------------------------------------------------------------------------


async def test_cancelling_the_awaiting_task_terminates_the_child(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    task = asyncio.create_task(run_in_child(sleep_forever, str(marker)))
    pid = await child_pid(marker)
    assert psutil.pid_exists(pid)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(pid), "SIGTERM ended the child"


async def test_child_ignoring_sigterm_stays_in_the_handle_until_killed(tmp_path: Path) -> None:
    """Cancellation only asks (SIGTERM); a child that ignores it is still owned by the attempt,
    whose kill_children() SIGKILLs it."""
    marker = tmp_path / "child.pid"
    handle = RunHandle("j1")
    task = start_under(handle, run_in_child(sleep_forever, str(marker), ignore_sigterm=True))
    pid = await child_pid(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [c.pid for c in handle.live_children()] == [pid], "still running after SIGTERM"
    assert handle.kill_children() == 1
    assert gone(pid)
    assert handle.children == set() and handle.live_children() == []


# -- RunHandle -------------------------------------------------------------------------------------


async def test_running_child_is_registered_and_kill_children_kills_it(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    handle = RunHandle("j1")
    task = start_under(handle, run_in_child(sleep_forever, str(marker)))
    pid = await child_pid(marker)
    assert [c.pid for c in handle.children] == [pid]
    assert [c.pid for c in handle.live_children()] == [pid]
    assert handle.kill_children() == 1
    with pytest.raises(ChildProcessLost, match=r"exit code -9\)"):
        await asyncio.wait_for(task, timeout=5)
    assert gone(pid)
    assert handle.children == set()
    assert handle.kill_children() == 0, "nothing left to kill"


async def test_finished_child_is_unregistered() -> None:
    handle = RunHandle("j1")
    assert await start_under(handle, run_in_child(add, 1, 1)) == 2
    assert handle.children == set()
    with pytest.raises(ChildError):
        await start_under(handle, run_in_child(fail, "x"))
    assert handle.children == set()


async def test_no_current_run_registers_nowhere(tmp_path: Path) -> None:
    """Outside an attempt (current_run unset) run_in_child still works and owns its child alone."""
    assert current_run.get() is None
    handle = RunHandle("j1")
    marker = tmp_path / "child.pid"
    task = asyncio.create_task(run_in_child(sleep_forever, str(marker)))
    pid = await child_pid(marker)
    assert handle.children == set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(pid)


def test_request_cancel_sets_the_flag_and_wakes_the_waiter() -> None:
    handle = RunHandle("j1")
    assert handle.cancel_requested is False
    handle.request_cancel()  # no waker: only the flag
    assert handle.cancel_requested is True
    woken: list[int] = []
    handle.waker = lambda: woken.append(1)
    handle.request_cancel()
    assert woken == [1]


def test_handles_are_distinct_per_attempt() -> None:
    """eq=False: two attempts of the same job id are two handles (sets and dicts keep both)."""
    first, second = RunHandle("j1"), RunHandle("j1")
    assert first != second
    assert len({first, second}) == 2
    first.request_cancel()
    assert not second.cancel_requested
