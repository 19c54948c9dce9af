"""JobStore: JobState in Redis, its indexes, and the atomic lifecycle transitions (Lua scripts)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError

from agent_async.errors import (
    AgentError,
    DuplicateJobError,
    EnqueueError,
    QueueUnavailableError,
    RequestCode,
    RequestRefusedError,
)
from agent_async.lifecycle import JobStatus, StartDecision, now_ms
from agent_async.state import JobState
from agent_async.store import codec, scripts
from agent_async.store.autopipeline import AutoPipeline
from agent_async.store.enqueue import BatchReply, Enqueues, IdCheck, PreparedEnqueue
from agent_async.store.keys import KeySpace
from agent_async.store.schema import CANCEL_REQUESTED_FIELD, new_state_extras, state_from_hash
from agent_async.store.scripts import LuaScript, ScriptCall, load_scripts, lua_source, run_script, store_script
from agent_async.store.types import CancelReply, EngineJob, EngineQueue, EngineRef, EngineRun, GateClaim, Transition

__all__ = ["JobStore"]


@contextmanager
def _reachable(what: str) -> Iterator[None]:
    """Turn "Redis is down" into the library's QueueUnavailableError (the API's 503)."""
    try:
        yield
    except (RedisConnectionError, TimeoutError) as exc:
        raise QueueUnavailableError(f"could not {what}: Redis is unreachable ({exc})") from exc


class JobStore:
    """Reads and writes JobState; every multi-key change is one Lua script, so it is all-or-nothing.

    Constructing it opens nothing: `bind()` gives it the Redis client of the process (the API's
    own, or a worker's arq pool). `engine_lua` is the queue engine's Lua library, loaded in front
    of each script so that enqueue, cancel and orphan recovery touch the engine's keys atomically
    without knowing their layout.
    """

    def __init__(
        self, *, keys: KeySpace, retention_s: int, lease_ms: int, engine_lua: str, engine_queue: EngineQueue,
        events: bool = True, metrics: bool = True, enqueue_resend_s: float = 0.0,
    ) -> None:
        self.keys = keys
        # '' turns the scripts' event writes off (lib.lua's emit), and their counters (lib.lua's metric).
        self.events_key = events_key = keys.events if events else ""
        self.metrics_key = metrics_key = keys.metrics if metrics else ""
        self.retention_s = retention_s
        self.lease_ms = lease_ms
        # How long a write that creates jobs is sent again while Redis is unreachable (Enqueues, groups).
        self.enqueue_resend_s = enqueue_resend_s
        self._redis: Redis | None = None
        self._engine_lua = engine_lua
        # State reads of concurrent callers share round trips (autopipeline.py).
        self.pipeline = AutoPipeline(lambda: self.redis)

        def script(name: str | tuple[str, ...], *, packed: bool = False) -> LuaScript:
            return store_script(name, engine_lua, events_key=events_key, metrics_key=metrics_key, packed=packed)

        # Concurrent callers' enqueues share one script call, as do enqueue_many's (store/enqueue.py).
        self.enqueues = Enqueues(lambda: self.redis, script(("enqueue_job.lua", "enqueue.lua")), constants=(
            keys.state(""), keys.active_index, keys.all_index, keys.user_index(""), keys.schedule_index(""),
            keys.owned_blobs, engine_queue.queue_key, engine_queue.id_prefix,
        ), retention_s=retention_s, resend_s=enqueue_resend_s)
        self._start = script("start.lua", packed=True)
        self._transition = script("transition.lua", packed=True)
        self._cancel = script("cancel.lua")
        self._orphan = script("orphan.lua")
        self._release_lock = LuaScript(lua_source("agent_async.store", "release_lock.lua"))

    def bind(self, redis: Redis | None) -> None:
        self._redis = redis

    @property
    def bound(self) -> bool:
        return self._redis is not None

    @property
    def redis(self) -> Redis:
        if self._redis is None:
            raise AgentError("the Agent is not connected: use `async with agent:` or await agent.open()")
        return self._redis

    async def load_scripts(self) -> None:
        """Make the scripts known to Redis (needed before they are queued inside another MULTI)."""
        scripts_ = (self.enqueues.script, self._start, self._transition, self._cancel, self._orphan)
        await load_scripts(self.redis, scripts_)

    async def ping(self) -> None:
        with _reachable("reach Redis"):
            await self.redis.ping()

    # -- writes ------------------------------------------------------------------------------

    async def create(
        self,
        state: JobState,
        *,
        gate: GateClaim | None,
        run: EngineRun,
        resume: bool = False,
        max_try: int = 1,
        owned_blobs: list[str] | None = None,
        new_id: bool = False,
    ) -> None:
        """Persist a PENDING state, take the gate slot and queue the engine job, all or nothing.

        Raises RequestRefusedError(JOB_CONCURRENT_LIMIT) when the gate is full, DuplicateJobError
        when the id exists, EnqueueError when Redis refuses (nothing is written in any case), and
        QueueUnavailableError (with the job's id) when Redis stayed unreachable while it was sent
        again (Enqueues). `new_id`: the id was just drawn by new_job_id, so no check that it
        exists (see `prepare`).
        """
        job = self.prepare(
            state, gate=gate, run=run, resume=resume, max_try=max_try, owned_blobs=owned_blobs, new_id=new_id
        )
        try:
            outcome = await self.enqueues.one(job)
        except QueueUnavailableError as exc:
            raise QueueUnavailableError(str(exc), job_id=state.job_id) from exc
        self.check_created(state, gate, outcome)

    @staticmethod
    def prepare(
        state: JobState, *, gate: GateClaim | None, run: EngineRun, resume: bool = False, max_try: int = 1,
        owned_blobs: list[str] | None = None, new_id: bool = False,
    ) -> PreparedEnqueue:
        """One new state's enqueue, built to be sent later (`create`, `create_many`): what
        enqueue_job.lua takes (it derives the keys and the engine's record itself).

        `new_id` skips the script's check that the id exists: an id new_job_id just drew (128
        random bits) cannot, and the check was one Redis command in every enqueue's dozen. An id
        the caller chose (a schedule's fire, a test's) is always checked."""
        now = state.created_ms
        return PreparedEnqueue([
            state.job_id, str(now), state.name, codec.dumps(state.payload), state.user_uid or "",
            state.schedule_name or "", gate.key if gate else "", str(gate.limit) if gate else "0",
            str(now + gate.ttl_ms) if gate else "0", str(run.score_ms), str(run.ttl_ms), "1" if resume else "0",
            str(max_try), codec.dumps(owned_blobs) if owned_blobs else "", IdCheck.DRAWN if new_id else IdCheck.CHOSEN,
            *new_state_extras(state),
        ])

    async def create_many(self, jobs: Sequence[PreparedEnqueue]) -> BatchReply:
        """Prepared enqueues in one script call, each job queued as `create` queues it, the call
        stopped at the first job Redis refuses (store/enqueue.py)."""
        return await self.enqueues.batch(jobs)

    def check_created(self, state: JobState, gate: GateClaim | None, outcome: Any) -> None:
        """Turn the enqueue script's reply into the exception `create` documents (none if queued)."""
        if outcome == 0:
            scope = state.user_uid or "the system"
            raise RequestRefusedError(
                RequestCode.JOB_CONCURRENT_LIMIT,
                f"{state.name}: {gate.limit if gate else 0} job(s) already in flight for {scope}",
            )
        if outcome == -1:
            raise DuplicateJobError(f"job id {state.job_id} already exists")
        if outcome == -2:
            raise EnqueueError(f"a key under namespace {self.keys.namespace!r} has the wrong type")

    async def start(self, job_id: str, *, started_ms: int | None = None, resent: bool = False) -> StartDecision:
        """PENDING/RETRY -> STARTED, attempts + 1; refuses to start a terminal or unknown job. (The
        fast worker's claim does the same for the jobs it takes: `starting_in`.)

        `resent`: this start was sent before with the same `started_ms`, and its reply was lost;
        if that send ran, this one answers as it did instead of taking it for a redelivery."""
        now, k = now_ms(), self.keys
        keys = [k.state(job_id), k.active_index, k.leases]
        at_ms = now if started_ms is None else started_ms
        call = self._start(keys, [job_id, at_ms, now + self.lease_ms, self.retention_s, "1" if resent else ""])
        return self.parse_start(await run_script(self.redis, call))

    def starting_in(self, body: str) -> tuple[LuaScript, tuple[str | int, ...]]:
        """The engine's script `body`, which starts the jobs it hands out (lib.lua's start_job), and what
        start_job needs: state key prefix, active index, leases, lease ms, retention s."""
        script = scripts.with_store_lib(
            body, self._engine_lua, events_key=self.events_key, metrics_key=self.metrics_key, packed=True
        )
        k = self.keys
        return script, (k.state(""), k.active_index, k.leases, self.lease_ms, self.retention_s)

    @staticmethod
    def parse_start(reply: Any) -> StartDecision:
        code = int(reply[0])
        if code == -1:
            return StartDecision(run=False, reason="no state")
        if code == -2:
            return StartDecision(run=False, reason=f"already {codec.text(reply[1])}")
        if code == -3:
            return StartDecision(run=False, reason=f"redelivered after its worker was lost: {codec.text(reply[1])}")
        return StartDecision(run=True, attempts=code, user_uid=codec.text(reply[1]) or None, name=codec.text(reply[2]))

    async def transition(
        self, job_id: str, status: JobStatus, *, result: dict[str, object] | None = None, error: str | None = None
    ) -> bool:
        """Move a non-terminal state to `status`; terminal moves release the slot and set the TTL.

        Returns False when the state is missing or already terminal (never overwritten).
        """
        call = self.call_for(self.transition_of(job_id, status, result=result, error=error))
        with _reachable(f"update job {job_id}"):
            return bool(await run_script(self.redis, call) == 1)

    async def run(self, call: ScriptCall) -> object:
        """Send a call built earlier (see `call_for`) on its own."""
        return await run_script(self.redis, call)

    @staticmethod
    def transition_of(
        job_id: str,
        status: JobStatus,
        *,
        result: dict[str, object] | None = None,
        error: str | None = None,
        undo_start: bool = False,
        attempt: int = 0,
    ) -> Transition:
        """The transition `transition` makes, as a value (its result encoded now), to be written
        later: alone (`call_for`) or with the engine's finish of its run (`attempt`: see Transition)."""
        return Transition(
            job_id, status, "" if result is None else codec.dumps(result), error or "", undo_start, attempt
        )

    def call_for(self, transition: Transition) -> ScriptCall:
        """A transition as its own script call (transition.lua), stamped with the time now."""
        t = transition
        return self._transition(
            [self.keys.state(t.job_id), self.keys.active_index, self.keys.leases],
            [t.job_id, t.status.value, now_ms(), self.retention_s, t.result, t.error, "1" if t.undo_start else "",
             t.attempt],
        )

    def ending_in(self, body: str) -> tuple[LuaScript, tuple[str | int, ...]]:
        """The engine's script `body`, which makes transitions (lib.lua's transition_job) for the runs
        it ends, and what they need: state key prefix, active index, leases, retention s."""
        script = scripts.with_store_lib(
            body, self._engine_lua, events_key=self.events_key, metrics_key=self.metrics_key
        )
        k = self.keys
        return script, (k.state(""), k.active_index, k.leases, self.retention_s)

    async def cancel(self, job_id: str, *, engine: EngineRef) -> CancelReply:
        """Cancel at once if not started, else flag it for its worker (see cancel.lua)."""
        k = self.keys
        with _reachable(f"cancel job {job_id}"):
            reply = codec.text(await run_script(self.redis, self._cancel(
                [k.state(job_id), k.active_index, k.leases, engine.queue_key, engine.job_key],
                [job_id, now_ms(), self.retention_s, engine.engine_job_id, k.cancel_channel],
            )))
        if not reply:
            return CancelReply.UNKNOWN
        return CancelReply.REQUESTED if reply == "REQUESTED" else CancelReply.SETTLED

    async def settle_orphan(self, job_id: str, *, engine: EngineJob) -> JobStatus | None:
        """Re-queue or end a job no worker holds (see orphan.lua); None if it was alive after all."""
        k = self.keys
        ref = engine.ref
        reply = codec.text(await run_script(self.redis, self._orphan(
            [k.state(job_id), k.active_index, k.leases, ref.queue_key, ref.job_key, ref.claim_key],
            [job_id, now_ms(), self.retention_s, ref.engine_job_id, engine.job_bytes, engine.score_ms,
             engine.ttl_ms],
        )))
        return JobStatus(reply) if reply else None

    async def renew_leases(self, job_ids: Sequence[str]) -> set[str]:
        """Extend the leases of these running jobs; returns those with a pending cancel request."""
        if not job_ids:
            return set()
        expiry = now_ms() + self.lease_ms
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self.keys.leases, dict.fromkeys(job_ids, expiry), xx=True)
            for job_id in job_ids:
                pipe.hget(self.keys.state(job_id), CANCEL_REQUESTED_FIELD)
            replies = await pipe.execute()
        return {job_id for job_id, flag in zip(job_ids, replies[1:], strict=True) if flag}

    async def lease_expiries(self, job_ids: Sequence[str]) -> list[int | None]:
        if not job_ids:
            return []
        scores = await self.redis.zmscore(self.keys.leases, list(job_ids))
        return [None if score is None else int(score) for score in scores]

    # -- locks and schedule skips ------------------------------------------------------------

    async def acquire_lock(self, key: str, *, ttl_s: float) -> str | None:
        """Take a lock for `ttl_s`; returns its token, or None if another holder has it."""
        token = uuid.uuid4().hex
        if await self.redis.set(key, token, nx=True, px=int(ttl_s * 1000)):
            return token
        return None

    async def release_lock(self, key: str, token: str) -> bool:
        """Release a lock only if it is still ours: a holder that outlived its TTL frees nothing."""
        return bool(await run_script(self.redis, self._release_lock([key], [token])))

    # -- reads -------------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobState | None:
        with _reachable(f"read job {job_id}"):
            raw = await self.pipeline.hgetall(self.keys.state(job_id))
        return state_from_hash(raw, job_id) if raw else None

    async def get_many(self, job_ids: Sequence[str]) -> list[JobState | None]:
        if not job_ids:
            return []
        with _reachable("read jobs"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hgetall(self.keys.state(job_id))
                raws = await pipe.execute()
        return [state_from_hash(raw, job_id) if raw else None for job_id, raw in zip(job_ids, raws, strict=True)]

    async def list_for_user(self, user_uid: str, *, offset: int = 0, limit: int = 50) -> list[JobState]:
        """The user's jobs, newest first."""
        return await self._list(self.keys.user_index(user_uid), offset, limit)

    async def list_all(self, *, offset: int = 0, limit: int = 50) -> list[JobState]:
        """Every user's jobs (and the system's), newest first."""
        return await self._list(self.keys.all_index, offset, limit)

    async def count_for_user(self, user_uid: str) -> int:
        with _reachable("count jobs"):
            return int(await self.redis.zcard(self.keys.user_index(user_uid)))

    async def list_by_schedule(self, schedule_name: str, *, offset: int = 0, limit: int = 50) -> list[JobState]:
        return await self._list(self.keys.schedule_index(schedule_name), offset, limit)

    async def active_job_ids(
        self, *, idle_for_ms: int = 0, offset: int = 0, limit: int | None = None
    ) -> list[str]:
        """Non-terminal jobs whose last transition is at least `idle_for_ms` old, oldest first."""
        cutoff = now_ms() - idle_for_ms
        if limit is None:
            ids = await self.redis.zrangebyscore(self.keys.active_index, "-inf", cutoff)
        else:
            ids = await self.redis.zrangebyscore(self.keys.active_index, "-inf", cutoff, start=offset, num=limit)
        return [i.decode() for i in ids]

    async def expired_leases(self) -> list[str]:
        """Running jobs whose worker stopped renewing their lease."""
        return [i.decode() for i in await self.redis.zrangebyscore(self.keys.leases, "-inf", now_ms())]

    async def forget_inactive(self, job_ids: Sequence[str]) -> int:
        """Drop active-index entries whose state is terminal or gone (left by a failed script)."""
        states = await self.get_many(job_ids)
        stale = [j for j, s in zip(job_ids, states, strict=True) if s is None or s.is_terminal]
        if stale:
            await self.redis.zrem(self.keys.active_index, *stale)
        return len(stale)

    async def slots_held(self, gate_key: str) -> int:
        """Live (unexpired) concurrency slots under one gate key."""
        await self.redis.zremrangebyscore(gate_key, "-inf", now_ms())
        return int(await self.redis.zcard(gate_key))

    async def _list(self, index: str, offset: int, limit: int) -> list[JobState]:
        with _reachable("list jobs"):
            ids = [i.decode() for i in await self.redis.zrevrange(index, offset, offset + limit - 1)]
        states = await self.get_many(ids)
        gone = [job_id for job_id, s in zip(ids, states, strict=True) if s is None]
        if gone:
            # Their state expired after the retention: the index entry is dead weight.
            await self.redis.zrem(index, *gone)
        return [s for s in states if s is not None]

