-- The queue engine's side of the store's scripts: how an arq job is queued, looked for and
-- dropped. Loaded in front of every store script, so the store's Lua never names arq's layout.
-- arq's data model: the job is a string key holding the serialized job with a TTL, the queue is
-- a zset of engine job ids scored by the run time in ms, a claim is the in-progress key.
-- @NAME@ placeholders are filled in from agent_async.engine.wire when the file is loaded.

local WAKE_CAP = @WAKE_CAP@
local WAKE_TTL_MS = @WAKE_TTL_MS@

-- Push wake-up: one token per job made runnable (due now or deferred: a deferred one may be due
-- sooner than an idle worker's wait), so one job wakes at most one idle fast worker (BLPOP serves
-- one client per token). Capped and expiring: busy workers poll and never read it. The cap is
-- kept loosely, trimmed back to WAKE_CAP once the list holds twice as many: with a backlog no
-- worker reads it, and a trim at every push cost each enqueue a second call.
-- `tokens`: how many jobs (a batch wakes once for all of them; at most WAKE_CAP tokens).
local function engine_wake(queue, tokens)
  local wake, pushed = queue .. '@WAKE_SUFFIX@', math.min(tokens or 1, WAKE_CAP)
  local n
  if pushed == 1 then
    n = redis.call('LPUSH', wake, '1')
  else
    local t = {}
    for i = 1, pushed do t[i] = '1' end
    n = redis.call('LPUSH', wake, unpack(t))
  end
  if n == pushed then
    redis.call('PEXPIRE', wake, WAKE_TTL_MS)
  elseif n >= 2 * WAKE_CAP then
    redis.call('LTRIM', wake, 0, WAKE_CAP - 1)
  end
end

-- arq's key of an engine job id, and arq's record of a job calling function `fn` with one
-- argument, the payload (its JSON text, as the state holds it): what arq's serialize_job writes
-- with our JSON serializer (engine/wire.py's serialize, tested to read back the same), built here
-- so an enqueue sends the payload once instead of once more inside the record.
-- engine_job_record(fn) gives record(payload, enqueue ms): the function's part is encoded once for
-- the jobs of one call that run the same function.
local function engine_job_key(engine_id) return '@JOB_PREFIX@' .. engine_id end

-- A claimed job that arq picks up itself, in a claim's reply (claim_lib.lua): its engine id and
-- score, 0 (not picked up), then seven false where a pickup's values would be (pickup.lua).
local function engine_not_picked(reply, engine_id, score)
  local n = #reply
  reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4], reply[n + 5] = engine_id, score, 0, false, false
  reply[n + 6], reply[n + 7], reply[n + 8], reply[n + 9] = false, false, false, false
end

local function engine_job_record(fn)
  local head = '{"t":null,"f":' .. cjson.encode(fn) .. ',"a":['
  return function(payload, enqueue_ms) return head .. payload .. '],"k":{},"et":' .. enqueue_ms .. '}' end
end

-- Whether the engine holds the job, or any of the other keys given exists (one call for all).
local function engine_has(job_key, ...)
  return redis.call('EXISTS', job_key, ...) > 0
end

-- Queueing in two steps, for a script that writes the queue entry itself among its other checked
-- zset writes (enqueue_job.lua: a queue of the wrong type then refuses the job, no TYPE call):
-- engine_queue_entry gives (zset, score, member), engine_store writes the job and wakes a worker
-- (or not: `wake` false, for a batch that wakes once for all its jobs).
-- Times and TTLs go to Redis as the text they came as (a number would be formatted with printf).
local function engine_queue_entry(queue, engine_id, score_ms)
  return queue, score_ms, engine_id
end

local function engine_store(queue, job_key, job_bytes, ttl_ms, wake)
  redis.call('PSETEX', job_key, ttl_ms, job_bytes)
  if wake then engine_wake(queue) end
end

local function engine_queue(queue, job_key, engine_id, job_bytes, score_ms, ttl_ms)
  redis.call('ZADD', queue, tonumber(score_ms), engine_id)
  engine_store(queue, job_key, job_bytes, ttl_ms, true)
end

-- Queue again a job whose worker was lost. arq skips a job whose in-progress key exists: a dead
-- worker's key would hold it back for up to the longest function timeout + 10 s.
local function engine_requeue(queue, job_key, claim_key, engine_id, job_bytes, score_ms, ttl_ms)
  if redis.call('EXISTS', job_key) == 0 then redis.call('PSETEX', job_key, tonumber(ttl_ms), job_bytes) end
  redis.call('ZADD', queue, tonumber(score_ms), engine_id)
  redis.call('DEL', claim_key)
  engine_wake(queue)
end

local function engine_drop(queue, job_key, claim_key, engine_id)
  if queue ~= '' then redis.call('ZREM', queue, engine_id) end
  if job_key ~= '' then redis.call('DEL', job_key) end
  if claim_key ~= '' then redis.call('DEL', claim_key) end
end
