"""Group commit (agent_async.store.group_commit): what callers ask for together goes out in one
send, each answer (and error) its own, a failed send every caller's, no timer and nothing stuck.
The send here is a plain coroutine recording what it got: the helper is generic (the enqueue and
finish scripts built on it are tested against Redis in test_enqueue.py and test_transactions.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from agent_async.store.group_commit import GroupCommit


class Recorder:
    """A send that answers each item with its double, fails odd items on request, and can be held."""

    def __init__(self, *, fail_odd: bool = False, fail_all: Exception | None = None) -> None:
        self.sends: list[list[int]] = []
        self.fail_odd = fail_odd
        self.fail_all = fail_all
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, items: list[int]) -> Sequence[int | BaseException]:
        self.sends.append(items)
        await self.release.wait()
        if self.fail_all is not None:
            raise self.fail_all
        return [ValueError(f"odd {i}") if self.fail_odd and i % 2 else 2 * i for i in items]


async def test_items_asked_for_together_go_out_in_one_send_each_with_its_answer() -> None:
    send = Recorder()
    group: GroupCommit[int, int] = GroupCommit(send, max_batch=10)
    assert await asyncio.gather(*(group.submit(i) for i in range(5))) == [0, 2, 4, 6, 8]
    assert send.sends == [[0, 1, 2, 3, 4]]
    assert (group.stats.items, group.stats.sends, group.stats.largest) == (5, 1, 5)


async def test_items_that_come_while_a_send_is_in_flight_go_out_together_next() -> None:
    send = Recorder()
    send.release.clear()
    group: GroupCommit[int, int] = GroupCommit(send, max_batch=10)
    first = asyncio.create_task(group.submit(0))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the first send is on its way, held
    rest = [asyncio.create_task(group.submit(i)) for i in range(1, 5)]
    await asyncio.sleep(0)
    assert send.sends == [[0]]
    send.release.set()
    assert await asyncio.gather(first, *rest) == [0, 2, 4, 6, 8]
    assert send.sends == [[0], [1, 2, 3, 4]]


async def test_a_send_is_capped_and_the_rest_follows() -> None:
    send = Recorder()
    group: GroupCommit[int, int] = GroupCommit(send, max_batch=4)
    assert await asyncio.gather(*(group.submit(i) for i in range(6))) == [0, 2, 4, 6, 8, 10]
    assert [len(s) for s in send.sends] == [4, 2]


async def test_one_items_error_is_its_own() -> None:
    group: GroupCommit[int, int] = GroupCommit(Recorder(fail_odd=True), max_batch=10)
    results = await asyncio.gather(*(group.submit(i) for i in range(4)), return_exceptions=True)
    assert results[0] == 0 and results[2] == 4
    assert [str(r) for r in results[1::2]] == ["odd 1", "odd 3"]


async def test_a_failed_send_fails_every_item_and_the_next_ones_go_out() -> None:
    send = Recorder(fail_all=ConnectionError("down"))
    group: GroupCommit[int, int] = GroupCommit(send, max_batch=10)
    results = await asyncio.gather(*(group.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert group.stats.sends == 0
    send.fail_all = None
    assert await group.submit(7) == 14


async def test_an_item_cancelled_before_its_send_is_left_out() -> None:
    send = Recorder()
    group: GroupCommit[int, int] = GroupCommit(send, max_batch=10)
    kept = asyncio.create_task(group.submit(1))
    dropped = asyncio.create_task(group.submit(2))
    await asyncio.sleep(0)  # both wait for the send, which has not run yet
    dropped.cancel()
    assert await kept == 2
    with pytest.raises(asyncio.CancelledError):
        await dropped
    assert send.sends == [[1]]


async def test_a_caller_who_gives_up_during_the_send_leaves_the_others_their_answers() -> None:
    send = Recorder()
    send.release.clear()
    group: GroupCommit[int, int] = GroupCommit(send, max_batch=10)
    tasks = [asyncio.create_task(group.submit(i)) for i in range(3)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    tasks[1].cancel()
    send.release.set()
    assert await tasks[0] == 0 and await tasks[2] == 4
    assert tasks[1].cancelled()
    assert await group.submit(5) == 10  # nothing is left stuck in flight


async def test_apart_each_item_goes_alone() -> None:
    send = Recorder()
    group: GroupCommit[int, int] = GroupCommit(send, max_batch=10, together=False)
    assert await asyncio.gather(*(group.submit(i) for i in range(3))) == [0, 2, 4]
    assert send.sends == [[0], [1], [2]]


async def test_a_lingering_send_waits_for_items_that_come_apart_and_goes_when_told() -> None:
    """With a linger, items that come a few ms apart go out together; the send goes as soon as the
    linger says nothing more is coming (here: after the fourth item), not at the end of its bound."""
    send = Recorder()
    expected = 4
    group: GroupCommit[int, int] = GroupCommit(
        send, max_batch=10, linger=lambda waiting: 5.0 if waiting < expected else 0.0
    )
    started = asyncio.get_running_loop().time()
    tasks = []
    for i in range(expected):
        tasks.append(asyncio.create_task(group.submit(i)))
        await asyncio.sleep(0.01)
    assert await asyncio.gather(*tasks) == [0, 2, 4, 6]
    assert send.sends == [[0, 1, 2, 3]]
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_a_lingering_send_goes_at_its_bound_with_what_came() -> None:
    """The linger bounds the wait of the oldest item: past it the send goes with what it has, and
    items after it go in the next send."""
    send = Recorder()
    group: GroupCommit[int, int] = GroupCommit(send, max_batch=10, linger=lambda waiting: 0.05)
    started = asyncio.get_running_loop().time()
    first = asyncio.create_task(group.submit(0))
    assert await first == 0
    waited_s = asyncio.get_running_loop().time() - started
    assert 0.05 <= waited_s < 1.0
    assert send.sends == [[0]]
    assert await asyncio.gather(group.submit(1), group.submit(2)) == [2, 4]
    assert send.sends == [[0], [1, 2]]


async def test_a_lingering_send_stops_waiting_when_the_batch_is_full() -> None:
    """Items that come apart wait for each other, and the send goes once it holds max_batch of
    them, long before its 5 s bound."""
    send = Recorder()
    group: GroupCommit[int, int] = GroupCommit(send, max_batch=3, linger=lambda waiting: 5.0)
    started = asyncio.get_running_loop().time()
    tasks = []
    for i in range(3):
        tasks.append(asyncio.create_task(group.submit(i)))
        await asyncio.sleep(0.01)
    assert await asyncio.gather(*tasks) == [0, 2, 4]
    assert send.sends == [[0, 1, 2]]
    assert asyncio.get_running_loop().time() - started < 1.0
