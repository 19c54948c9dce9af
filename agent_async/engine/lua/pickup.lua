-- pickup: what arq's run_job does first with a job (its pickup transaction: GET the job, INCR its
-- tries, EXPIRE them, ZREM it from the abort set; the tries, for a job the start ran, are its
-- state's attempts) and the store's START transition (lib.lua's
-- start_job), done inside the claim for the jobs it takes, so a job runs one round trip after its
-- claim instead of two. The worker answers arq's pickup transaction from this reply
-- (engine/transactions.py, PoolWithPickup). Loaded after the store's lib.lua, before claim_lib.lua.
-- KEYS: none of its own (the claim's)
-- ARGV: none of its own: pickup_setup(args, first) reads, from args[first] on: engine id prefix of
--       this namespace's jobs, state key prefix, active index, leases, lease ms, retention s, arq's
--       abort set ('' if aborts are off) (Pickup.args, engine/claim.py)
-- pickup_all(engine ids, now) -> per job {job, tries, aborted, start reply}, or false for a job
-- that is not one of this namespace's tracked jobs (a cron tick): arq then picks it up itself.

local P_ENGINE, P_STATE, P_ACTIVE, P_LEASES, P_LEASE_MS, P_RETENTION, P_ABORT

local function pickup_setup(args, first)
  P_ENGINE, P_STATE, P_ACTIVE, P_LEASES = args[first], args[first + 1], args[first + 2], args[first + 3]
  P_LEASE_MS, P_RETENTION, P_ABORT = tonumber(args[first + 4]), args[first + 5], args[first + 6]
end

local function pickup_one(engine_id, job, now, abort_live)
  local job_id = string.sub(engine_id, #P_ENGINE + 1)
  local aborted = 0
  if abort_live then aborted = redis.call('ZREM', P_ABORT, engine_id) end
  -- A state that makes the start fail (not a hash) fails this job's start alone, not the claim of
  -- the others: the worker then sends the start itself, which reports the error.
  local ok, started = pcall(start_job, P_STATE .. job_id, P_ACTIVE, P_LEASES, job_id, now, now + P_LEASE_MS,
                            P_RETENTION)
  if not ok then started = false end
  -- The try: a job the start ran counts its tries in its state (attempts, one more at each start,
  -- none for a hand-back, which undoes its start), the count every limit of ours reads; arq's own
  -- tries key would repeat it, one command per job. A job not started here (refused, or a state
  -- that failed) keeps arq's count: arq's INCR then EXPIRE, a first try in one SET.
  local tries = started and started[1] > 0 and started[1] or nil
  if not tries then
    local tries_key = '@RETRY_PREFIX@' .. engine_id
    tries = 1
    if not redis.call('SET', tries_key, '1', 'EX', @RETRY_TTL_S@, 'NX') then
      tries = redis.call('INCR', tries_key)
      redis.call('EXPIRE', tries_key, @RETRY_TTL_S@)
    end
  end
  return {job or false, tries, aborted, started}
end

local function pickup_all(engine_ids, now)
  local out, mine, job_keys = {}, {}, {}
  for i, engine_id in ipairs(engine_ids) do
    out[i] = false
    if string.sub(engine_id, 1, #P_ENGINE) == P_ENGINE and string.sub(engine_id, #P_ENGINE + 1, #P_ENGINE + 5) ~= 'cron:' then
      mine[#mine + 1] = i
      job_keys[#job_keys + 1] = engine_job_key(engine_id)
    end
  end
  if #mine == 0 then return out end
  -- Every job's record in one call; whether arq's abort set holds anything, once (the script is
  -- atomic, and only our own ZREMs change it meanwhile).
  local jobs = redis.call('MGET', unpack(job_keys))
  local abort_live = P_ABORT ~= '' and redis.call('EXISTS', P_ABORT) == 1
  batch_begin()
  for n, i in ipairs(mine) do out[i] = pickup_one(engine_ids[i], jobs[n], now, abort_live) end
  batch_end()
  return out
end
