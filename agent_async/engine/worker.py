"""The fast worker: arq's Worker with batch claims, push wake-up and finishes sent together, fewer
round trips per job."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any, cast

from arq.connections import ArqRedis
from redis.exceptions import NoScriptError, RedisError

from agent_async.engine.claim import (
    ARQ_MARK,
    SERVER_NOW,
    Claimed,
    PickedUp,
    claim_call,
    claim_in_finish,
    mark_in_finish,
    next_wait,
    parse_claim,
)
from agent_async.engine.direct import DirectRun
from agent_async.engine.finish import RunEnd, linger_while_running
from agent_async.engine.hand_backs import HandBacks
from agent_async.engine.hooks import CTX_COMMIT_IN_FINISH, START_REPLY, Hooks
from agent_async.engine.stoppable import StoppableWorker
from agent_async.engine.transactions import PoolWithPickup, PoolWithScript
from agent_async.engine.wakeup import Idle, Wait, Waker, wait_set
from agent_async.engine.wire import EngineNames
from agent_async.store import ScriptCall, run_script

__all__ = ["FastWorker"]

logger = logging.getLogger(__name__)

# A cron tick is enqueued by arq's heart_beat this long before it is due (arq's run_cron window:
# 2 x max(poll_delay, 0.5 s)); an idle worker wakes this much after the window opens, since arq's
# test is strict (`next_run < now + window`).
_CRON_WAKE_MARGIN_S = 0.01

# The script to prepend to arq's finish transaction, set only while that finish runs, and whether
# that finish queues the job again (a retry, a shutdown hand-back): then it also wakes a worker.
_FINISH_SCRIPT: ContextVar[ScriptCall | None] = ContextVar("agent_async_finish_script", default=None)
_FINISH_WAKE: ContextVar[str | None] = ContextVar("agent_async_finish_wake", default=None)
# The pickup the claim did for the job whose run_job runs (answers arq's pickup transaction).
_PICKED: ContextVar[PickedUp | None] = ContextVar("agent_async_picked", default=None)


class FastWorker(StoppableWorker, DirectRun):
    """arq's Worker with fewer round trips per job (`Agent.run_worker`, `python -m app worker`).

    - Due jobs are claimed in one script per batch (as many as there are free slots) instead of
      arq's four-step optimistic transaction per job.
    - While idle it blocks in Redis on the queue's wake list instead of polling (push wake-up,
      docs/performance.md), bounded by the next deferred job, retry or cron tick.
    - The claim also picks each job up and makes its START transition (engine/lua/pickup.lua):
      such a job runs in the task the worker made for it, without arq's second task and pickup
      transaction (engine/direct.py). The outcome rides on arq's finish transaction: no window
      in which arq has forgotten a job whose state is not terminal.
    - Jobs that arq drops before running them (no hook is called) are ended in that same finish.
    - The runs that end together are finished in one script call (engine/finish.py), with no
      timer: each outcome with arq's finish of its job. That call also claims as many due jobs
      as it ends runs, and each job it takes runs in the slot of a run that ended (no claim call
      of its own while the worker is busy).
    It overrides arq internals (_poll_iteration, run_job, finish_job, finish_failed_job,
    _release_sem_dec_counter_on_complete, _sleep_until_tasks_complete, the pool property): arq is
    pinned to 0.28.*, and every worker test runs under both worker kinds.
    """

    def __init__(
        self, *, hooks: Hooks, names: EngineNames, push_wakeup: bool = True, max_block_s: float = 10.0,
        coalesce: bool = True, finish_linger_ms: float = 0.0, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # The finishes of runs that end together go out in one script call (`coalesce`; with a linger,
        # waiting for each other), which claims jobs for the slots they free (claim_for, claimed).
        linger = linger_while_running(finish_linger_ms, lambda: self.job_counter) if finish_linger_ms else None
        self.finisher = hooks.finisher(lambda: cast(ArqRedis, self._pool), queue=self.queue_name,
                                       aborts=self.allow_abort_jobs, batch=coalesce, claims=self, linger=linger)
        # Jobs a finish claimed, each waiting for the slot of a run that ended (_job_task_done).
        self._slot_waiters: collections.deque[tuple[str, int]] = collections.deque()
        # arq's in-progress TTL, which a claim gives each job it takes.
        self._claim_ttl_ms = int(self.in_progress_timeout_s * 1000)
        self.claimed_with_finishes = 0
        self._closing = False
        self._hooks = hooks
        self._names = names
        self.ctx[CTX_COMMIT_IN_FINISH] = True
        # Burst runs (tests, `drain`) end when the queue is empty: they poll, as arq does.
        self._push = push_wakeup and not self.burst
        self._poll_pause_s = self.poll_delay_s
        # arq's loop only yields between iterations: each iteration waits for what it needs (a
        # free slot, a wake-up or a poll pause) at its start, so a freed slot is refilled at once.
        self.poll_delay_s = 0.0
        self._max_block_s = max_block_s
        self._wait: Wait | None = None
        self._waker: Waker | None = None
        self._slot_freed = asyncio.Event()
        # What the claims picked up, until each job's run_job takes its own (see run_job).
        self._pickup = hooks.claim_pickup(aborts=self.allow_abort_jobs)
        self._picked: dict[str, PickedUp] = {}
        self._hand_backs = HandBacks(pool=lambda: cast(ArqRedis, self._pool), undo_start=hooks.hand_back, names=names,
                                     leases_key=hooks.leases_key)
        self._on_shutdown, self.on_shutdown = self.on_shutdown, self._on_shutdown_after_hand_backs

    async def _poll_iteration(self) -> None:
        """arq's iteration, with the claims as one script per batch and, with push wake-up, the
        wait for work at its start (arq sleeps poll_delay between iterations instead)."""
        if self._hand_backs.pending:
            await self._hand_backs.give_back_lost()
        wait, self._wait = self._wait, None
        claimed = await self._wait_for_work(wait) if wait is not None else None
        if claimed is not None:
            self._wait = await self._start(claimed)  # before the heartbeat: it can wait, they cannot
        # Before a claim: a cron tick enqueued now counts in the claim's next-deferred time.
        cron_runs = [job.next_run for job in self.cron_jobs]
        await self.heart_beat()
        ticked = cron_runs != [job.next_run for job in self.cron_jobs]
        if claimed is not None:
            if ticked and self._wait is not None and self._wait.kind is Idle.WORK:
                # That claim ran behind the wake-up, before the heartbeat queued a cron tick: its
                # next-deferred time misses the tick. Claim again now, which sees it.
                self._wait = None
        else:
            free = self.max_jobs - self.job_counter
            if self.burst and self.max_burst_jobs >= 0:
                free = min(free, self.max_burst_jobs - self._jobs_started())
                if free < 1:
                    return
            self._wait = await self._claim(free) if self.allow_pick_jobs else Wait(Idle.STOP)
        if self.allow_abort_jobs:
            await self._cancel_aborted_jobs()
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # arq's way of letting an error in run_job end the loop

    def _claim_call(self, free: int, at: int | str | None = None, mark: str = ARQ_MARK) -> ScriptCall:
        return claim_call(
            self.queue_name, self._names.wake_key, wanted=free, ttl_ms=self._claim_ttl_ms,
            read_limit=self.queue_read_limit, at=at, pickup=self._pickup, mark=mark, held=self.job_counter,
        )

    async def _claim(self, free: int) -> Wait | None:
        """Claim up to `free` due jobs in one call and start them; say what to wait for next."""
        if free < 1:
            return Wait(Idle.SLOT)
        with self._hand_backs.sending() as mark:
            reply = await run_script(self.pool, self._claim_call(free, mark=mark))
        return await self._start(parse_claim(reply))

    async def _start(self, claimed: Claimed) -> Wait | None:
        self._picked.update(claimed.picked)
        for job_id, score in claimed.jobs:
            await self.sem.acquire()  # never waits: at most `free` jobs were claimed
            self.job_counter += 1
            self._run_in_slot(job_id, score)
        return next_wait(claimed, slots_full=self.job_counter >= self.max_jobs)

    def _run_in_slot(self, job_id: str, score: int) -> None:
        """Run a claimed job in a slot already counted (its semaphore held) for it."""
        task = self.loop.create_task(self.run_job(job_id, score))
        task.add_done_callback(functools.partial(self._job_task_done, job_id, self._picked.get(job_id)))
        self.tasks[job_id] = task

    def _job_task_done(self, job_id: str, picked: PickedUp | None, task: asyncio.Task[None]) -> None:
        if self.tasks.get(job_id) is task and not task.cancelled() and task.exception() is None:
            # Gone at once: a busy worker whose slots pass from run to run (below) wakes its loop,
            # which clears arq's task table, only every few seconds. A task that failed or was
            # cancelled stays for the loop, which lets its error end it, as arq's does.
            del self.tasks[job_id]
        if self._slot_waiters and not self._taking_no_jobs:
            # A job the finish of this run claimed takes its slot: no release, no claim call.
            self._run_in_slot(*self._slot_waiters.popleft())
        else:
            self._release_sem_dec_counter_on_complete()
            if self._taking_no_jobs:
                self._hand_back_slot_waiters()
        # Only this task's own pickup: a retry of the same job may be claimed again (and its new
        # pickup stored) before this task's callbacks run.
        if picked is not None and self._picked.get(job_id) is picked:
            # Cancelled before run_job began (a stop right after the claim): the claim started
            # it, nothing ran it. Undo that before arq closes its pool (_on_shutdown_after_hand_backs).
            self._give_back(job_id)

    # -- FinishClaims: the claim inside the finish of runs (engine/finish.py) --------------------

    def claim_for(self, runs: Sequence[str]) -> tuple[int, tuple[str | int, ...]]:
        """Claim, with the finish of these runs, as many jobs: their slots free as the runs end
        (the loop claims any other free slot itself). None when the worker takes no more jobs, or
        counts them in burst mode."""
        if self._taking_no_jobs or (self.burst and self.max_burst_jobs >= 0):
            return 0, ()
        return claim_in_finish(len(runs), ttl_ms=self._claim_ttl_ms, read_limit=self.queue_read_limit,
                               pickup=self._pickup, mark=self._hand_backs.mark(),
                               held=max(0, self.job_counter - len(runs)))

    def unanswered(self, claim_args: tuple[str | int, ...]) -> None:
        self._hand_backs.lost(mark_in_finish(claim_args))

    def claimed(self, reply: Any, runs: Sequence[str]) -> None:
        """The jobs a finish claimed, each to run in the slot of a run as its task ends (called
        before those runs learn their finish is written); one for a run already over goes back."""
        claimed = parse_claim(reply)
        self._picked.update(claimed.picked)
        ending = sum(1 for run in runs if (task := self.tasks.get(run)) is not None and not task.done())
        keep = 0 if self._taking_no_jobs else ending
        self._slot_waiters.extend(claimed.jobs[:keep])
        self.claimed_with_finishes += min(keep, len(claimed.jobs))
        for job_id, _ in claimed.jobs[keep:]:
            self._give_back(job_id)

    @property
    def _taking_no_jobs(self) -> bool:
        return self._closing or self.stopping.is_set() or not self.allow_pick_jobs

    def _give_back(self, job_id: str) -> None:
        """A claimed job nothing here will run: back to the queue, as it was (engine/hand_backs.py)."""
        self._picked.pop(job_id, None)
        self._hand_backs.give_back(job_id)

    def _hand_back_slot_waiters(self) -> None:
        """A stop came between a finish's claim and the slots its jobs waited for."""
        while self._slot_waiters:
            self._give_back(self._slot_waiters.popleft()[0])

    async def _on_shutdown_after_hand_backs(self, ctx: dict[str, Any]) -> None:
        await self._hand_backs.wait()
        if self._on_shutdown is not None:
            await self._on_shutdown(ctx)

    def _release_sem_dec_counter_on_complete(self) -> None:
        super()._release_sem_dec_counter_on_complete()
        self._slot_freed.set()

    async def _sleep_until_tasks_complete(self) -> None:
        # arq's SIGTERM drain waits while self.tasks is not empty, and finished tasks leave it only
        # at the next iteration: a worker blocked in Redis would sit out the whole drain time.
        # (A claim already in flight at the signal may add one more: hence the loop.)
        while pending := [task for task in self.tasks.values() if not task.done()]:
            await asyncio.wait(pending)

    async def _wait_for_work(self, wait: Wait) -> Claimed | None:
        """Wait as `wait` says; with push wake-up, the claim rides behind the blocking pop (its
        reply is returned: the jobs it took are claimed and must be started)."""
        timeout_s, on_time = self._wait_bound_s(wait)
        if timeout_s <= 0:
            return None
        if wait.kind is Idle.POLL:
            await asyncio.sleep(min(self._poll_pause_s, timeout_s))
        elif wait.kind is Idle.STOP:
            await asyncio.sleep(timeout_s)
        elif wait.kind is Idle.SLOT:
            self._slot_freed.clear()
            if self.job_counter >= self.max_jobs:
                await wait_set(self._slot_freed, timeout_s)
        elif not self._push:
            await asyncio.sleep(min(self._poll_pause_s, timeout_s))
        else:
            if self._waker is None:
                self._waker = Waker(cast(ArqRedis, self._pool), self._names.wake_key)
            # One turn of the loop first: the jobs just started take their next step (into their
            # attempt's task) before this wait builds and sends its claim (0.1 ms when idle).
            await asyncio.sleep(0)
            # Slots only free up during the wait: the claim may take fewer than it could, never more.
            free = self.max_jobs - self.job_counter
            with self._hand_backs.sending() as mark:
                then = self._claim_call(free, SERVER_NOW, mark) if free > 0 and self.allow_pick_jobs else None
                woken = await self._waker.wait(timeout_s, on_time=on_time, then=then)
            if woken.then is not None:
                return parse_claim(woken.then)
        return None

    def _wait_bound_s(self, wait: Wait) -> tuple[float, bool]:
        """How long the worker may wait, and whether that bound is a time something is due (a
        deferred job, a cron tick, the health record) rather than the plain cap."""
        now_s = time.time()
        due_s = []
        if wait.until_ms is not None:
            due_s.append(wait.until_ms / 1000 - now_s)
        window_s = 2 * max(self.poll_delay_s, 0.5)
        due_s.extend(
            job.next_run.timestamp() - now_s - window_s + _CRON_WAKE_MARGIN_S
            for job in self.cron_jobs if job.next_run is not None
        )
        due_s.append(self._last_health_check + self.health_check_interval - now_s)
        soonest_s = min(due_s)
        if soonest_s < self._max_block_s:
            return soonest_s, True
        return self._max_block_s, False

    async def close(self) -> None:
        self._closing = True
        if self._waker is not None:
            await self._waker.close()
            # Claims that ran behind a wait the stop cancelled: their jobs were started, and
            # nothing here will run them.
            for reply in self._waker.salvaged:
                for job_id, _ in parse_claim(reply).jobs:
                    self._give_back(job_id)
            self._waker.salvaged.clear()
        self._hand_back_slot_waiters()
        await self._hand_backs.give_back_lost_at_close()
        self.finisher.log_stats(claimed_with_them=self.claimed_with_finishes)
        await super().close()

    @property
    def pool(self) -> ArqRedis:
        base = cast(ArqRedis, self._pool)
        picked = _PICKED.get()
        if picked is not None and not picked.answered:
            return cast(ArqRedis, PoolWithPickup(base, picked))
        call, wake_key = _FINISH_SCRIPT.get(), _FINISH_WAKE.get()
        if call is None and wake_key is None:
            return base
        return cast(ArqRedis, PoolWithScript(base, call, wake_key))

    async def run_job(self, job_id: str, score: int) -> None:
        # The claim picked the job up and started it (pickup.lua): on_job_start reads the start's
        # reply, and the job runs directly (engine/direct.py). Off that path arq's run_job runs
        # it, its pickup transaction (GET job, INCR tries) answered from the claim's reply; if arq
        # then drops the job before running it, finish_failed_job ends the state. A cron tick, or
        # a job not of this namespace, arq picks up itself.
        picked = self._picked.pop(job_id, None)
        if picked is None:
            await super().run_job(job_id, score)
            return
        direct = self.direct_job(picked)
        tokens = _PICKED.set(None if direct else picked), START_REPLY.set(picked.start)
        try:
            if direct is not None:
                await self.run_direct(job_id, score, direct, picked.tries)
            else:
                await super().run_job(job_id, score)
        finally:
            _PICKED.reset(tokens[0])
            START_REPLY.reset(tokens[1])
            # Its outcome is written (finish_job waits for Redis) or left to recovery.
            self._hooks.release(job_id)

    async def finish_run(self, job_id: str, done: bool, requeue_ms: int | None) -> None:
        """A run this worker ran itself (engine/direct.py): its outcome and arq's finish, with the
        runs that end together (engine/finish.py), sent until Redis takes them (as _finish_with)."""
        end = RunEnd(job_id, self._hooks.take_commit(job_id), done, requeue_ms)
        await self._hooks.write_outcome(job_id, lambda: self.finisher.finish(end))

    async def finish_job(self, job_id: str, *args: Any) -> None:
        # arq's run_job (off the direct path): our outcome in front of arq's finish transaction.
        call = self._hooks.commit_call(job_id)
        # arq's finish_job(job_id, finish, result_data, result_timeout_s, keep_result_forever,
        # incr_score, keep_in_progress): an incr_score queues the job again, maybe for an idle
        # worker blocked since before (its wait ends at the time it knew of).
        requeued = len(args) > 4 and args[4] is not None
        token = _FINISH_WAKE.set(self._names.wake_key if requeued else None)
        try:
            await self._finish_with(job_id, call, lambda: super(FastWorker, self).finish_job(job_id, *args))
        finally:
            _FINISH_WAKE.reset(token)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        call = self._hooks.dropped_call(job_id, result_data)
        await self._finish_with(job_id, call, lambda: super(FastWorker, self).finish_failed_job(job_id, result_data))

    async def _finish_with(
        self, engine_id: str, call: ScriptCall | None, finish: Callable[[], Awaitable[None]]
    ) -> None:
        """arq's finish transaction with our outcome in front, sent until Redis takes it.

        arq would let a Redis error escape and lose the outcome while the worker lives on: here
        the worker keeps it (and the job's lease) and sends it again once Redis answers.
        """

        async def send() -> None:
            token = _FINISH_SCRIPT.set(call)
            try:
                await finish()
            except NoScriptError:
                # Redis lost our scripts (restart, SCRIPT FLUSH) while arq's part of EXEC went
                # through: send the outcome on its own, which loads the script again.
                if call is not None:
                    await self._hooks.send_alone(call)
            finally:
                _FINISH_SCRIPT.reset(token)

        try:
            await self._hooks.write_outcome(engine_id, send)
        except RedisError:
            # Not an outage (write_outcome handles those): log it and keep serving. What was not
            # written is found by the reconciler (state) or redelivered (arq's job).
            logger.exception("finishing a job failed; the reconciler will settle its state")
