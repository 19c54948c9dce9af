-- The queue engine's side of the store's scripts: how an arq job is queued, looked for and
-- dropped. Loaded in front of every store script, so the store's Lua never names arq's layout.
-- arq's data model: the job is a string key holding the serialized job with a TTL, the queue is
-- a zset of engine job ids scored by the run time in ms, a claim is the in-progress key.

local function engine_has(job_key)
  return redis.call('EXISTS', job_key) == 1
end

local function engine_queue(queue, job_key, engine_id, job_bytes, score_ms, ttl_ms)
  redis.call('PSETEX', job_key, tonumber(ttl_ms), job_bytes)
  redis.call('ZADD', queue, tonumber(score_ms), engine_id)
end

-- Queue again a job whose worker was lost. arq skips a job whose in-progress key exists: a dead
-- worker's key would hold it back for up to the longest function timeout + 10 s.
local function engine_requeue(queue, job_key, claim_key, engine_id, job_bytes, score_ms, ttl_ms)
  if redis.call('EXISTS', job_key) == 0 then redis.call('PSETEX', job_key, tonumber(ttl_ms), job_bytes) end
  redis.call('ZADD', queue, tonumber(score_ms), engine_id)
  redis.call('DEL', claim_key)
end

local function engine_drop(queue, job_key, claim_key, engine_id)
  if queue ~= '' then redis.call('ZREM', queue, engine_id) end
  if job_key ~= '' then redis.call('DEL', job_key) end
  if claim_key ~= '' then redis.call('DEL', claim_key) end
end
