"""JobPersistency: JobState CRUD in Redis, its indexes, and the atomic lifecycle transitions."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, TimeoutError

from agent_async import codec
from agent_async.errors import ERROR_JOB_CONCURRENT_LIMIT, EnqueueError, QueueUnavailableError, RequestException
from agent_async.keys import KeySpace
from agent_async.scripts import LuaScript, ScriptCall, load_scripts, run_script
from agent_async.state import TERMINAL, JobState, JobStatus, now_ms

__all__ = ["EngineWrite", "GateClaim", "JobPersistency", "StartDecision"]

# Terminal statuses as the Lua scripts see them.
_TERMINAL_CSV = ",".join(sorted(s.value for s in TERMINAL))
# Index entries older than the retention are checked (and dropped if their state expired) this
# many at a time, so indexes stay bounded without a full scan on any single call.
_PRUNE_BATCH = 10

_LUA_HELPERS = """
local function is_terminal(status)
  return string.find(',' .. ARGV_TERMINAL .. ',', ',' .. status .. ',', 1, true) ~= nil
end
local function prune(index, state_prefix, cutoff_ms)
  if index == '' then return end
  local old = redis.call('ZRANGEBYSCORE', index, '-inf', cutoff_ms, 'LIMIT', 0, PRUNE_BATCH)
  for _, member in ipairs(old) do
    if redis.call('EXISTS', state_prefix .. member) == 0 then redis.call('ZREM', index, member) end
  end
end
local function zset_or_none(key)
  if key == '' then return true end
  local t = redis.call('TYPE', key)['ok']
  return t == 'zset' or t == 'none'
end
""".replace("PRUNE_BATCH", str(_PRUNE_BATCH))

# KEYS: state, active, user index|'', schedule index|'', gate|'', engine queue, engine job
# ARGV: job id, now ms, gate limit, gate slot expiry ms, engine job id, engine score, engine job
#       bytes, engine job ttl ms, state key prefix, index cutoff ms, then hash field/value pairs.
# Every check comes before the first write: a refused enqueue writes nothing.
_ENQUEUE = _LUA_HELPERS + """
local state, active, user_idx, sched_idx, gate, queue, engine_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local job_id, now = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', state) == 1 or redis.call('EXISTS', engine_key) == 1 then return -1 end
for _, key in ipairs({active, user_idx, sched_idx, gate, queue}) do
  if not zset_or_none(key) then return -2 end
end
local limit = tonumber(ARGV[3])
if gate ~= '' and limit > 0 then
  redis.call('ZREMRANGEBYSCORE', gate, '-inf', now)
  if redis.call('ZCARD', gate) >= limit then return 0 end
end
local fields = {}
for i = 11, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', state, unpack(fields))
redis.call('HSET', state, 'updated_ms', now)
if gate ~= '' and limit > 0 then
  redis.call('HSET', state, 'gate', gate, 'gate_ttl_ms', tonumber(ARGV[4]) - now)
end
redis.call('ZADD', active, now, job_id)
if user_idx ~= '' then redis.call('ZADD', user_idx, now, job_id) end
if sched_idx ~= '' then redis.call('ZADD', sched_idx, now, job_id) end
if gate ~= '' and limit > 0 then
  redis.call('ZADD', gate, tonumber(ARGV[4]), job_id)
  if redis.call('PTTL', gate) < tonumber(ARGV[4]) - now then redis.call('PEXPIREAT', gate, tonumber(ARGV[4])) end
end
redis.call('PSETEX', engine_key, tonumber(ARGV[8]), ARGV[7])
redis.call('ZADD', queue, tonumber(ARGV[6]), ARGV[5])
prune(user_idx, ARGV[9], ARGV[10])
prune(sched_idx, ARGV[9], ARGV[10])
return 1
"""

# Ends a state for good: terminal fields, out of the active index and the leases, slot freed,
# retention TTL. Used by every script that can end a job.
_LUA_END = """
local function end_job(state, active, leases, job_id, status, now, retention_s, err)
  local fields = {'status', status, 'updated_ms', now, 'finished_ms', now}
  if err and err ~= '' then fields[#fields + 1] = 'error'; fields[#fields + 1] = err end
  redis.call('HSET', state, unpack(fields))
  redis.call('ZREM', active, job_id)
  redis.call('ZREM', leases, job_id)
  local gate = redis.call('HGET', state, 'gate')
  if gate then redis.call('ZREM', gate, job_id) end
  redis.call('EXPIRE', state, retention_s)
end
local function drop_engine_job(queue, engine_key, in_progress_key, engine_id)
  if queue ~= '' then redis.call('ZREM', queue, engine_id) end
  if engine_key ~= '' then redis.call('DEL', engine_key) end
  if in_progress_key ~= '' then redis.call('DEL', in_progress_key) end
end
"""

# KEYS: state, active, leases   ARGV: job id, now ms, lease expiry ms, retention s
# Returns {attempts, user, name} when the job may run, {-1} if no state, {-2, status} if it is
# terminal, {-3, status} if it was ended here: a redelivery of a run whose worker was lost, for a
# job that may not resume (or is out of attempts), or that was asked to cancel.
_START = _LUA_HELPERS + _LUA_END + """
local state, active, leases = KEYS[1], KEYS[2], KEYS[3]
local job_id, now = ARGV[1], tonumber(ARGV[2])
local h = redis.call('HMGET', state, 'status', 'user', 'name', 'gate', 'gate_ttl_ms', 'resume', 'max_try',
                     'attempts', 'cancel_requested_ms')
if not h[1] then return {-1} end
if is_terminal(h[1]) then return {-2, h[1]} end
if h[1] == 'STARTED' then
  -- arq redelivered a run that never finished: its worker was lost.
  if h[9] then
    end_job(state, active, leases, job_id, 'CANCELED', now, ARGV[4], 'canceled: its worker was lost while it ran')
    return {-3, 'CANCELED'}
  end
  if h[6] ~= '1' or tonumber(h[8]) >= tonumber(h[7] or '1') then
    end_job(state, active, leases, job_id, 'FAILURE', now, ARGV[4],
            'WorkerLost: the worker was lost during attempt ' .. h[8] ..
            (h[6] == '1' and ' (no attempts left)' or ' (resume is off)'))
    return {-3, 'FAILURE'}
  end
end
local attempts = redis.call('HINCRBY', state, 'attempts', 1)
redis.call('HSET', state, 'status', 'STARTED', 'started_ms', now, 'updated_ms', now)
redis.call('ZADD', active, now, job_id)
redis.call('ZADD', leases, tonumber(ARGV[3]), job_id)
if h[4] then
  -- The slot's safety-net TTL counts from the start of the run, not from the enqueue.
  local expiry = now + tonumber(h[5])
  if redis.call('ZADD', h[4], 'XX', 'CH', expiry, job_id) == 1 and redis.call('PTTL', h[4]) < expiry - now then
    redis.call('PEXPIREAT', h[4], expiry)
  end
end
return {attempts, h[2] or '', h[3]}
"""

# KEYS: state, active, leases
# ARGV: job id, new status, now ms, retention s, result json|'', error|'', '1' to undo a start
#       that never ran
# A terminal state is never overwritten. Returns 1 if the transition happened, else 0.
_TRANSITION = _LUA_HELPERS + _LUA_END + """
local state, active, leases = KEYS[1], KEYS[2], KEYS[3]
local job_id, new_status, now = ARGV[1], ARGV[2], ARGV[3]
local h = redis.call('HMGET', state, 'status', 'error')
local current = h[1]
if not current or is_terminal(current) then return 0 end
if ARGV[5] ~= '' then redis.call('HSET', state, 'result', ARGV[5]) end
if ARGV[6] == '' and h[2] then redis.call('HDEL', state, 'error') end
if ARGV[7] == '1' and current == 'STARTED' then
  -- Marked STARTED in the pickup transaction, but the engine dropped the job before running it.
  redis.call('HINCRBY', state, 'attempts', -1)
  redis.call('HDEL', state, 'started_ms')
end
if is_terminal(new_status) then
  end_job(state, active, leases, job_id, new_status, now, ARGV[4], ARGV[6])
else
  redis.call('HSET', state, 'status', new_status, 'updated_ms', now)
  if ARGV[6] ~= '' then redis.call('HSET', state, 'error', ARGV[6]) end
  redis.call('ZADD', active, now, job_id)
  if new_status ~= 'STARTED' then redis.call('ZREM', leases, job_id) end
end
return 1
"""

# KEYS: state, active, leases, engine queue, engine job   ARGV: job id, now ms, retention s,
#       engine job id, cancel channel
# Not started yet: CANCELED at once and out of arq's queue (it never runs). Running: flag it and
# tell the workers; the one running it stops it. Returns the status after the call, 'REQUESTED'
# for a running job, or '' if there is no such job.
_CANCEL = _LUA_HELPERS + _LUA_END + """
local state, active, leases, queue, engine_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local job_id, now = ARGV[1], ARGV[2]
local status = redis.call('HGET', state, 'status')
if not status then return '' end
if is_terminal(status) then return status end
if status == 'STARTED' then
  redis.call('HSET', state, 'cancel_requested_ms', now)
  redis.call('PUBLISH', ARGV[5], job_id)
  return 'REQUESTED'
end
end_job(state, active, leases, job_id, 'CANCELED', now, ARGV[3], 'canceled before it started')
drop_engine_job(queue, engine_key, '', ARGV[4])
return 'CANCELED'
"""

# KEYS: state, active, leases, engine queue, engine job, engine in-progress
# ARGV: job id, now ms, retention s, engine job id, engine job bytes, engine score ms, engine
#       job ttl ms
# Settles a job that no worker holds: a STARTED job whose lease ran out (its worker died), or a
# PENDING/RETRY job that is not in arq's queue. Re-queued under the same id if it may resume and
# has attempts left; otherwise FAILURE (or CANCELED if a cancel was pending). Returns the status
# it got, or '' if the job turned out to be alive or already settled.
_ORPHAN = _LUA_HELPERS + _LUA_END + """
local state, active, leases, queue, engine_key, in_progress = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local job_id, now = ARGV[1], tonumber(ARGV[2])
local h = redis.call('HMGET', state, 'status', 'resume', 'max_try', 'attempts', 'cancel_requested_ms')
local status = h[1]
if not status or is_terminal(status) then return '' end
if status == 'STARTED' then
  local lease = redis.call('ZSCORE', leases, job_id)
  if lease and tonumber(lease) > now then return '' end
elseif redis.call('EXISTS', engine_key) == 1 then
  return ''
end
local lost = status == 'STARTED' and 'the worker was lost during attempt ' .. h[4] or 'it was no longer queued'
if h[5] then
  end_job(state, active, leases, job_id, 'CANCELED', now, ARGV[3], 'canceled: ' .. lost)
  drop_engine_job(queue, engine_key, in_progress, ARGV[4])
  return 'CANCELED'
end
if h[2] == '1' and tonumber(h[4]) < tonumber(h[3] or '1') then
  redis.call('HSET', state, 'status', 'PENDING', 'updated_ms', now, 'error', 'WorkerLost: ' .. lost .. '; queued again')
  redis.call('ZADD', active, now, job_id)
  redis.call('ZREM', leases, job_id)
  if redis.call('EXISTS', engine_key) == 0 then
    redis.call('PSETEX', engine_key, tonumber(ARGV[7]), ARGV[5])
  end
  redis.call('ZADD', queue, tonumber(ARGV[6]), ARGV[4])
  -- arq skips a job whose in-progress key exists; a dead worker's key would hold it for up to
  -- the longest timeout + 10 s.
  redis.call('DEL', in_progress)
  return 'PENDING'
end
end_job(state, active, leases, job_id, 'FAILURE', now, ARGV[3],
        'WorkerLost: ' .. lost .. (h[2] == '1' and ' (no attempts left)' or ' (resume is off)'))
drop_engine_job(queue, engine_key, in_progress, ARGV[4])
return 'FAILURE'
"""


def _with_terminal(script: str) -> str:
    return script.replace("ARGV_TERMINAL", repr(_TERMINAL_CSV).replace("'", '"'))


@dataclass(frozen=True, slots=True)
class GateClaim:
    """A concurrency slot to take atomically with the enqueue."""

    key: str
    limit: int
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class EngineWrite:
    """What the queue engine needs written, opaque to this module (Agent builds it)."""

    queue_key: str
    job_key: str
    engine_job_id: str
    job_bytes: bytes
    score_ms: int
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class StartDecision:
    run: bool
    attempts: int = 0
    user_uid: str | None = None
    name: str = ""
    reason: str = ""


@contextmanager
def _reachable(what: str) -> Iterator[None]:
    """Turn "Redis is down" into the library's QueueUnavailableError (the API's 503)."""
    try:
        yield
    except (RedisConnectionError, TimeoutError) as exc:
        raise QueueUnavailableError(f"could not {what}: Redis is unreachable ({exc})") from exc


class JobPersistency:
    """Reads and writes JobState; every multi-key change is one Lua script, so it is all-or-nothing."""

    def __init__(self, redis: Redis, *, keys: KeySpace, retention_s: int, lease_ms: int = 30_000) -> None:
        self.redis = redis
        self.keys = keys
        self.retention_s = retention_s
        self.lease_ms = lease_ms
        self._enqueue = LuaScript(_with_terminal(_ENQUEUE))
        self._start = LuaScript(_with_terminal(_START), packed=True)
        self._transition = LuaScript(_with_terminal(_TRANSITION), packed=True)
        self._cancel = LuaScript(_with_terminal(_CANCEL))
        self._orphan = LuaScript(_with_terminal(_ORPHAN))

    async def load_scripts(self) -> None:
        """Make the scripts known to Redis (needed before they are queued inside another MULTI)."""
        await load_scripts(self.redis, (self._enqueue, self._start, self._transition, self._cancel, self._orphan))

    # -- writes ------------------------------------------------------------------------------

    async def create(
        self, state: JobState, *, gate: GateClaim | None, engine: EngineWrite, resume: bool = False, max_try: int = 1
    ) -> None:
        """Persist a PENDING state, take the gate slot and queue the engine job, all or nothing.

        Raises RequestException(ERROR_JOB_CONCURRENT_LIMIT) when the gate is full, EnqueueError when
        Redis refuses (nothing is written in either case).
        """
        k = self.keys
        now = state.created_ms
        flat: list[str | bytes | int] = []
        # resume and max_try travel with the state so the scripts can settle a lost run alone.
        fields = {**state.to_redis(), "resume": "1" if resume else "0", "max_try": str(max_try)}
        for field_name, value in fields.items():
            flat += [field_name, value]
        args: list[str | bytes | int] = [
            state.job_id, now,
            gate.limit if gate else 0, now + gate.ttl_ms if gate else 0,
            engine.engine_job_id, engine.score_ms, engine.job_bytes, engine.ttl_ms,
            k.state(""), now - self.retention_s * 1000,
            *flat,
        ]
        keys = [
            k.state(state.job_id), k.active_index,
            k.user_index(state.user_uid) if state.user_uid else "",
            k.schedule_index(state.schedule_name) if state.schedule_name else "",
            gate.key if gate else "",
            engine.queue_key, engine.job_key,
        ]
        try:
            outcome = await run_script(self.redis, self._enqueue(keys, args))
        except (RedisConnectionError, TimeoutError) as exc:
            raise QueueUnavailableError(f"could not enqueue {state.name}: Redis is unreachable ({exc})") from exc
        except RedisError as exc:
            raise EnqueueError(f"could not enqueue {state.name}: {exc}") from exc
        if outcome == 0:
            scope = state.user_uid or "the system"
            raise RequestException(
                ERROR_JOB_CONCURRENT_LIMIT,
                f"{state.name}: {gate.limit if gate else 0} job(s) already in flight for {scope}",
            )
        if outcome == -1:
            raise EnqueueError(f"job id {state.job_id} already exists")
        if outcome == -2:
            raise EnqueueError(f"a key under namespace {self.keys.namespace!r} has the wrong type")

    async def start(self, job_id: str) -> StartDecision:
        """PENDING/RETRY -> STARTED, attempts + 1; refuses to start a terminal or unknown job."""
        return self.parse_start(await run_script(self.redis, self.start_call(job_id)))

    def start_call(self, job_id: str) -> ScriptCall:
        """The start transition, built to be sent later (e.g. inside arq's own pickup transaction)."""
        now = now_ms()
        k = self.keys
        return self._start(
            [k.state(job_id), k.active_index, k.leases], [job_id, now, now + self.lease_ms, self.retention_s]
        )

    @staticmethod
    def parse_start(reply: Any) -> StartDecision:
        code = int(reply[0])
        if code == -1:
            return StartDecision(run=False, reason="no state")
        if code == -2:
            return StartDecision(run=False, reason=f"already {reply[1].decode()}")
        if code == -3:
            return StartDecision(run=False, reason=f"redelivered after its worker was lost: {reply[1].decode()}")
        return StartDecision(run=True, attempts=code, user_uid=reply[1].decode() or None, name=reply[2].decode())

    async def transition(
        self, job_id: str, status: JobStatus, *, result: dict[str, object] | None = None, error: str | None = None
    ) -> bool:
        """Move a non-terminal state to `status`; terminal moves release the slot and set the TTL.

        Returns False when the state is missing or already terminal (never overwritten).
        """
        call = self.transition_call(job_id, status, result=result, error=error)
        with _reachable(f"update job {job_id}"):
            return bool(await run_script(self.redis, call))

    async def run(self, call: ScriptCall) -> object:
        """Send a call built earlier (see `transition_call`) on its own."""
        return await run_script(self.redis, call)

    def transition_call(
        self,
        job_id: str,
        status: JobStatus,
        *,
        result: dict[str, object] | None = None,
        error: str | None = None,
        undo_start: bool = False,
    ) -> ScriptCall:
        """The same transition, built to be sent later (e.g. inside arq's own finish transaction)."""
        return self._transition(
            [self.keys.state(job_id), self.keys.active_index, self.keys.leases],
            [
                job_id, status.value, now_ms(), self.retention_s,
                "" if result is None else codec.dumps(result), error or "", "1" if undo_start else "",
            ],
        )

    async def cancel(self, job_id: str, *, engine: tuple[str, str, str]) -> str:
        """Cancel at once if not started, else flag it for its worker; see _CANCEL for the reply."""
        queue, engine_key, engine_id = engine
        k = self.keys
        with _reachable(f"cancel job {job_id}"):
            reply = await run_script(self.redis, self._cancel(
                [k.state(job_id), k.active_index, k.leases, queue, engine_key],
                [job_id, now_ms(), self.retention_s, engine_id, k.cancel_channel],
            ))
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    async def settle_orphan(self, job_id: str, *, engine: EngineWrite, in_progress_key: str) -> str:
        """Re-queue or end a job no worker holds (see _ORPHAN); '' if it was alive after all."""
        k = self.keys
        reply = await run_script(self.redis, self._orphan(
            [k.state(job_id), k.active_index, k.leases, engine.queue_key, engine.job_key, in_progress_key],
            [job_id, now_ms(), self.retention_s, engine.engine_job_id, engine.job_bytes, engine.score_ms,
             engine.ttl_ms],
        ))
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    async def renew_leases(self, job_ids: Sequence[str]) -> set[str]:
        """Extend the leases of these running jobs; returns those with a pending cancel request."""
        if not job_ids:
            return set()
        expiry = now_ms() + self.lease_ms
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self.keys.leases, dict.fromkeys(job_ids, expiry), xx=True)
            for job_id in job_ids:
                pipe.hget(self.keys.state(job_id), "cancel_requested_ms")
            replies = await pipe.execute()
        return {job_id for job_id, flag in zip(job_ids, replies[1:], strict=True) if flag}

    async def lease_expiries(self, job_ids: Sequence[str]) -> list[int | None]:
        if not job_ids:
            return []
        scores = await self.redis.zmscore(self.keys.leases, list(job_ids))
        return [None if score is None else int(score) for score in scores]

    # -- reads -------------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobState | None:
        with _reachable(f"read job {job_id}"):
            raw = await self.redis.hgetall(self.keys.state(job_id))  # type: ignore[misc]
        return JobState.from_redis(raw) if raw else None

    async def get_many(self, job_ids: Sequence[str]) -> list[JobState | None]:
        if not job_ids:
            return []
        with _reachable("read jobs"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hgetall(self.keys.state(job_id))
                raws = await pipe.execute()
        return [JobState.from_redis(raw) if raw else None for raw in raws]

    async def list_for_user(self, user_uid: str, *, offset: int = 0, limit: int = 50) -> list[JobState]:
        """The user's jobs, newest first."""
        return await self._list(self.keys.user_index(user_uid), offset, limit)

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

