"""arq's hooks: the one place where JobState transitions are driven, on both worker kinds.

- `on_job_start`: the START transition (PENDING/RETRY -> STARTED, attempts + 1, lease). On the
  fast worker the claim did it (engine/lua/pickup.lua); here its reply is read (or, under arq's
  stock Worker, the transition is sent).
- the job function (`job_entry`): runs the attempt through the JobHandler and keeps its Outcome
  in arq's per-job ctx, since no arq hook sees a job's result or exception.
- `on_job_end`: the outcome (SUCCESS, FAILURE, CANCELED, RETRY, or a hand-back). It runs before
  arq writes anything: on the fast worker the outcome is committed inside arq's finish
  transaction (one atomic write); under the stock Worker it is written here, before arq's
  finish. `after_job_end` is not used: a worker that died between arq's result write and that
  hook would leave a finished job STARTED, later reported lost (or run again).
- jobs arq drops before running them call no hook: the fast worker ends them in arq's own
  failed-finish transaction (`dropped_call`), the recovery pass does so under the stock Worker.
Every hook catches everything: a hook that raises kills arq's poll loop.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from arq.constants import abort_jobs_ss
from arq.worker import Retry
from redis.asyncio import Redis

from agent_async.engine.claim import CLAIM_WITH_PICKUP, Pickup
from agent_async.engine.finish import FINISH_BATCH, FinishClaims, Finisher
from agent_async.engine.wire import EngineNames, dropped_from_result
from agent_async.errors import AgentError
from agent_async.lifecycle import JobStatus, Outcome, StartDecision, dropped_outcome, interrupted_outcome, now_ms
from agent_async.logs import job_fields
from agent_async.outage import OUTAGE_ERRORS, RedisOutage, send_through_outage
from agent_async.registry import JobRegistry
from agent_async.schedules.scheduler import FireResult
from agent_async.store import JobStore, ScriptCall, Transition, check_buffers

__all__ = ["START_REPLY", "Hooks", "JobHandler", "ScheduleTicker"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# When on_job_start could not reach Redis, the job is handed back to the queue for this long.
_START_FAILED_RETRY_S = 1.0
# An outcome a live worker holds is written again, with backoff, for this long while Redis is
# unreachable: past it (a very long outage) the job is left to recovery.
OUTCOME_RETRY_FOR_S = 300.0

# ctx keys shared by our hooks and the job function within one arq run.
_CTX_DECISION = "agent_async.decision"
_CTX_OUTCOME = "agent_async.outcome"
# Set in the worker ctx by the fast worker: outcomes are committed inside arq's finish transaction.
CTX_COMMIT_IN_FINISH = "agent_async.commit_in_finish"


class JobHandler(Protocol):
    """What the hooks need from the worker side of the library (agent_async.worker)."""

    async def startup(self, redis: Redis) -> None: ...

    async def shutdown(self) -> None: ...

    async def run(self, name: str, payload: dict[str, Any], *, job_id: str, decision: StartDecision) -> Outcome: ...

    def release(self, job_id: str) -> None: ...


class ScheduleTicker(Protocol):
    """What a cron tick calls (agent_async.schedules.Scheduler)."""

    async def fire(self, name: str, fire_at: datetime) -> FireResult: ...

    async def tick_overrides(self, at: datetime) -> dict[str, FireResult]: ...


# The reply of the START transition the fast worker's claim made for this job (pickup.lua), set
# only while its run_job runs; on_job_start reads it. None: not started yet (or it failed there).
START_REPLY: ContextVar[Any] = ContextVar("agent_async_start_reply", default=None)


class Hooks:
    """arq's hooks and job functions for one namespace, bound to the store and the job handler."""

    def __init__(
        self,
        *,
        store: JobStore,
        names: EngineNames,
        registry: JobRegistry,
        jobs: JobHandler,
        schedules: Callable[[], ScheduleTicker],
        outage: RedisOutage,
        freeze_gc: bool = False,
    ) -> None:
        self._store = store
        self.outage = outage
        self._names = names
        self._registry = registry
        self._jobs = jobs
        self._schedules = schedules
        self._freeze_gc = freeze_gc
        # Outcomes waiting for the finish of their run, by engine job id (fast worker only).
        self._commits: dict[str, Transition] = {}

    # -- process -----------------------------------------------------------------------------

    async def on_startup(self, ctx: dict[str, Any]) -> None:
        # arq's pool (claims, finishes, and the store under arq's CLI): connections it makes from
        # now on are checked without redis-py 5's zero-timeout read (store/readiness.py).
        await self._jobs.startup(check_buffers(ctx["redis"]))
        if self._freeze_gc:
            # Everything alive now lives as long as the worker: out of the collector's sight, a
            # full collection no longer walks it (measured: one 50-60 ms stall of the event loop
            # every few thousand jobs without this, none over 1.5 ms with it).
            gc.collect()
            gc.freeze()

    async def on_shutdown(self, ctx: dict[str, Any]) -> None:
        await self._jobs.shutdown()

    # -- one job -----------------------------------------------------------------------------

    async def on_job_start(self, ctx: dict[str, Any]) -> None:
        engine_id = ctx.get("job_id", "?")
        if self._names.is_cron_tick(engine_id):
            # A schedule's tick: it creates a tracked run, it is not one.
            ctx[_CTX_DECISION] = StartDecision(run=False, reason="cron tick")
            return
        job_id = self._names.job_id(engine_id)
        started = START_REPLY.get()
        try:
            if job_id is None:
                ctx[_CTX_DECISION] = StartDecision(run=False, reason="not a job of this namespace")
            elif started is not None:
                ctx[_CTX_DECISION] = self._store.parse_start(started)
            else:
                decision = await self._send_start(job_id)
                if decision is None:
                    return
                ctx[_CTX_DECISION] = decision
        except Exception:
            logger.exception("job %s: could not record STARTED; it goes back to the queue", engine_id)
            return
        decision = ctx[_CTX_DECISION]
        if not decision.run:
            logger.warning("job %s not run: %s", engine_id, decision.reason)

    async def _send_start(self, job_id: str) -> StartDecision | None:
        """The START transition, sent again while Redis is unreachable: a send whose reply was lost
        (Redis went down after running it) may have started the job, and only a send with the same
        start time can tell (lib.lua's start_job). Given up before the first send's lease could
        run out, after which recovery may settle the job (None: it goes back to the queue)."""
        started_ms = now_ms()

        async def send(resent: bool) -> StartDecision:
            return await self._store.start(job_id, started_ms=started_ms, resent=resent)

        _, decision = await self._through_outage(
            f"job {job_id}: its start", send, for_s=self._store.lease_ms / 2000, then="it goes back to the queue"
        )
        return decision

    def job_entry(self, name: str) -> Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]:
        """The arq function of one job name: runs the attempt whose start on_job_start recorded."""

        async def run(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
            decision: StartDecision | None = ctx.get(_CTX_DECISION)
            if decision is None:
                # on_job_start could not record STARTED: hand the job back rather than run it untracked.
                raise Retry(defer=_START_FAILED_RETRY_S)
            if not decision.run:
                return
            job_id = self._names.job_id(ctx["job_id"]) or ctx["job_id"]
            # Bound before the runner creates the attempt's task: the task copies the context, so
            # every line of the run (process() included) carries the fields.
            with job_fields(job_id=job_id, job=name, user_uid=decision.user_uid, attempt=decision.attempts):
                outcome = await self._jobs.run(name, payload, job_id=job_id, decision=decision)
            ctx[_CTX_OUTCOME] = outcome
            if outcome.status is JobStatus.RETRY:
                raise Retry(defer=outcome.retry_in_s)

        run.__qualname__ = f"agent_job[{name}]"
        return run

    async def on_job_end(self, ctx: dict[str, Any]) -> None:
        decision: StartDecision | None = ctx.get(_CTX_DECISION)
        if decision is None or not decision.run:
            return
        job_id = self._names.job_id(ctx["job_id"]) or ctx["job_id"]
        outcome: Outcome | None = ctx.get(_CTX_OUTCOME)
        if outcome is None:
            # arq cancelled the attempt itself: a worker shutdown past its drain time.
            outcome = interrupted_outcome(self._registry.request(decision.name), decision.attempts)
        transition = self._store.transition_of(
            job_id, outcome.status, result=outcome.result, error=outcome.error, attempt=decision.attempts
        )
        if ctx.get(CTX_COMMIT_IN_FINISH):
            # The fast worker sends it with arq's finish of the run, then releases the job.
            self._commits[ctx["job_id"]] = transition
            return
        call = self._store.call_for(transition)
        try:
            with job_fields(job_id=job_id, job=decision.name, user_uid=decision.user_uid, attempt=decision.attempts):
                await self.write_outcome(job_id, lambda: self._store.run(call))
        finally:
            self._jobs.release(job_id)

    async def write_outcome(self, job_id: str, write: Callable[[], Awaitable[object]]) -> bool:
        """Send an outcome, again and again with backoff while Redis is unreachable (the worker
        holds the outcome and keeps the job's lease renewed meanwhile), for OUTCOME_RETRY_FOR_S.

        Returns False if it gave up: the job is then left to recovery. Sending twice is harmless:
        a terminal state is never overwritten, a move that is not an end is refused once its
        attempt is over (lib.lua's transition_job, STALE), and arq's finish only deletes.
        """
        try:
            sent, _ = await self._through_outage(
                f"job {job_id}: its outcome", lambda _resent: write(), for_s=OUTCOME_RETRY_FOR_S,
                then="it is left to recovery",
            )
        except Exception:
            logger.exception("job %s: its outcome could not be written; recovery will settle it", job_id)
            return False
        return sent

    async def _through_outage(
        self, what: str, send: Callable[[bool], Awaitable[T]], *, for_s: float, then: str
    ) -> tuple[bool, T | None]:
        """`send(resent)`, again with backoff while Redis is unreachable, for `for_s`: (True, its
        reply), or (False, None) if Redis stayed away (logged with what happens `then`). Any other
        error is raised."""
        try:
            reply = await send_through_outage(send, for_s=for_s, failed=lambda exc: self.outage.failed(what, exc))
        except OUTAGE_ERRORS:
            logger.error("%s: Redis unreachable for %.0fs; %s", what, for_s, then)
            return False, None
        self.outage.ok()
        return True, reply

    def release(self, engine_id: str) -> None:
        """The fast worker finished this job (outcome written or given up): stop its lease."""
        job_id = self._names.job_id(engine_id)
        if job_id is not None:
            self._jobs.release(job_id)

    # -- the fast worker's finish transactions ----------------------------------------------

    def claim_pickup(self, *, aborts: bool) -> Pickup:
        """The claim that also picks up and starts each of this namespace's jobs (pickup.lua)."""
        script, store_args = self._store.starting_in(CLAIM_WITH_PICKUP)
        return Pickup(script, (self._names.engine_job_id(""), *store_args, abort_jobs_ss if aborts else ""))

    @property
    def leases_key(self) -> str:
        return self._store.keys.leases

    async def hand_back(self, engine_id: str) -> None:
        """Undo the start the claim made for a job that never ran here (its task was cancelled
        before it began): the state goes back to PENDING, attempts as they were."""
        job_id = self._names.job_id(engine_id)
        if job_id is not None and not self._names.is_cron_tick(engine_id):
            undo = self._store.transition_of(job_id, JobStatus.PENDING, undo_start=True)
            await self._store.run(self._store.call_for(undo))

    def take_commit(self, engine_id: str) -> Transition | None:
        """The outcome on_job_end left for the finish of this job's run."""
        return self._commits.pop(engine_id, None)

    def commit_call(self, engine_id: str) -> ScriptCall | None:
        """The same, as a script call of its own (to put in front of arq's finish transaction)."""
        transition = self.take_commit(engine_id)
        return None if transition is None else self._store.call_for(transition)

    def finisher(
        self, pool: Callable[[], Redis], *, queue: str, aborts: bool, batch: bool, claims: FinishClaims | None = None,
        linger: Callable[[int], float] | None = None,
    ) -> Finisher:
        """The fast worker's finishes of runs (engine/finish.py), this namespace's transitions in them."""
        script, store_args = self._store.ending_in(FINISH_BATCH)
        return Finisher(
            pool, script, store_args, queue=queue, wake_key=self._names.wake_key,
            abort_set=abort_jobs_ss if aborts else "", batch=batch, claims=claims, linger=linger,
        )

    def dropped_call(self, engine_id: str, result_data: bytes | None) -> ScriptCall | None:
        """The end of a job arq dropped before running it, to send inside arq's failed finish."""
        job_id = self._names.job_id(engine_id)
        if job_id is None:
            return None
        dropped = dropped_from_result(result_data)
        outcome = dropped_outcome(dropped.reason if dropped else None, canceled=bool(dropped and dropped.canceled))
        # The pickup transaction already marked it STARTED: undo that count.
        return self._store.call_for(
            self._store.transition_of(job_id, outcome.status, error=outcome.error, undo_start=True)
        )

    async def send_alone(self, call: ScriptCall) -> None:
        """Send a call that could not ride arq's transaction (Redis lost our scripts)."""
        await self._store.run(call)

    # -- schedules ---------------------------------------------------------------------------

    def cron_tick(self, name: str) -> Callable[[dict[str, Any]], Awaitable[str]]:
        async def tick(ctx: dict[str, Any]) -> str:
            outcome = await self._schedules().fire(name, _tick_time(ctx))
            logger.info("schedule %s: %s", name, outcome)
            return outcome.value

        tick.__qualname__ = f"cron_tick[{name}]"
        return tick

    async def override_tick(self, ctx: dict[str, Any]) -> None:
        fired = await self._schedules().tick_overrides(_tick_time(ctx))
        shown = {name: result.value for name, result in fired.items() if result is not FireResult.NOT_MINE}
        if shown:
            logger.info("override tick: %s", shown)


def _tick_time(ctx: dict[str, Any]) -> datetime:
    """The fire time of an arq cron tick: its job id ends with it, in ms (arq's unique cron id)."""
    try:
        return datetime.fromtimestamp(int(str(ctx["job_id"]).rsplit(":", 1)[1]) / 1000, UTC)
    except (IndexError, ValueError) as exc:
        raise AgentError(f"not a cron tick id: {ctx.get('job_id')!r}") from exc
