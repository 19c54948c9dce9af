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
-- pickup_all(engine ids, scores, now, reply) appends to `reply` nine values per job (engine/claim.py's
-- _STRIDE): engine id, score, then 1, job, tries, aborted and start_job's three values (false where
-- it gave none, all false if the start failed), or 0 and six false for a job that is not one of this
-- namespace's tracked jobs (a cron tick): arq then picks it up itself. Flat: each table in a
-- script's reply costs Redis a dozen lookups to convert.

local P_ENGINE, P_STATE, P_ACTIVE, P_LEASES, P_LEASE_MS, P_RETENTION, P_ABORT

local function pickup_setup(args, first)
  P_ENGINE, P_STATE, P_ACTIVE, P_LEASES = args[first], args[first + 1], args[first + 2], args[first + 3]
  P_LEASE_MS, P_RETENTION, P_ABORT = tonumber(args[first + 4]), args[first + 5], args[first + 6]
end

local function pickup_one(engine_id, job, now, lease_expiry, abort_live, reply)
  local job_id = string.sub(engine_id, #P_ENGINE + 1)
  local aborted = 0
  if abort_live then aborted = redis.call('ZREM', P_ABORT, engine_id) end
  -- A state that makes the start fail (not a hash) fails this job's start alone, not the claim of
  -- the others: the worker then sends the start itself, which reports the error.
  local ok, code, user, name = pcall(start_job, P_STATE .. job_id, P_ACTIVE, P_LEASES, job_id, now, lease_expiry,
                                     P_RETENTION)
  if not ok then code, user, name = false, false, false end
  -- The try: a job the start ran counts its tries in its state (attempts, one more at each start,
  -- none for a hand-back, which undoes its start), the count every limit of ours reads; arq's own
  -- tries key would repeat it, one command per job. A job not started here (refused, or a state
  -- that failed) keeps arq's count: arq's INCR then EXPIRE, a first try in one SET.
  local tries = code and code > 0 and code or nil
  if not tries then
    local tries_key = '@RETRY_PREFIX@' .. engine_id
    tries = 1
    if not redis.call('SET', tries_key, '1', 'EX', @RETRY_TTL_S@, 'NX') then
      tries = redis.call('INCR', tries_key)
      redis.call('EXPIRE', tries_key, @RETRY_TTL_S@)
    end
  end
  local n = #reply
  reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = 1, job or false, tries, aborted
  reply[n + 5], reply[n + 6], reply[n + 7] = code, user or false, name or false
end

local function pickup_all(engine_ids, scores, now, reply)
  local mine, job_keys = {}, {}
  for i, engine_id in ipairs(engine_ids) do
    if string.sub(engine_id, 1, #P_ENGINE) == P_ENGINE and string.sub(engine_id, #P_ENGINE + 1, #P_ENGINE + 5) ~= 'cron:' then
      mine[i] = true
      job_keys[#job_keys + 1] = engine_job_key(engine_id)
    end
  end
  -- Every job's record in one call; whether arq's abort set holds anything, once (the script is
  -- atomic, and only our own ZREMs change it meanwhile).
  local jobs = #job_keys > 0 and redis.call('MGET', unpack(job_keys)) or {}
  local abort_live = #job_keys > 0 and P_ABORT ~= '' and redis.call('EXISTS', P_ABORT) == 1
  local now_text, lease_expiry = int_text(now), int_text(now + P_LEASE_MS)
  local k = 0
  batch_begin()
  for i, engine_id in ipairs(engine_ids) do
    if mine[i] then
      k = k + 1
      local n = #reply
      reply[n + 1], reply[n + 2] = engine_id, scores[i]
      pickup_one(engine_id, jobs[k], now_text, lease_expiry, abort_live, reply)
    else
      engine_not_picked(reply, engine_id, scores[i])
    end
  end
  batch_end()
end
