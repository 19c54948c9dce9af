-- pickup: what arq's run_job does first with a job (its pickup transaction: GET the job, INCR its
-- tries, EXPIRE them, ZREM it from the abort set) and the store's START transition (lib.lua's
-- start_job), done inside the claim for each job it takes, so a job runs one round trip after its
-- claim instead of two. The worker answers arq's pickup transaction from this reply
-- (engine/transactions.py, PoolWithPickup). Loaded after the store's lib.lua, before claim_batch.lua.
-- KEYS: the claim's (claim_batch.lua)
-- ARGV: the claim's five, then: engine id prefix of this namespace's jobs, state key prefix,
--       active index, leases, lease ms, retention s, arq's abort set ('' if aborts are off)
-- pickup(engine id, now) -> {job, tries, aborted, start reply}, or false for a job that is not
-- one of this namespace's tracked jobs (a cron tick): arq then picks it up itself.

local P_ENGINE, P_STATE, P_ACTIVE, P_LEASES = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local P_LEASE_MS, P_RETENTION, P_ABORT = tonumber(ARGV[10]), ARGV[11], ARGV[12]

-- Whether arq's abort set holds anything: read once per claim (the script is atomic, and only our
-- own ZREMs change it meanwhile), not once per job: a batch of N jobs spends one call, not N.
local p_abort_live = nil

local function pickup(engine_id, now)
  if string.sub(engine_id, 1, #P_ENGINE) ~= P_ENGINE then return false end
  local job_id = string.sub(engine_id, #P_ENGINE + 1)
  if string.sub(job_id, 1, 5) == 'cron:' then return false end
  local job = redis.call('GET', '@JOB_PREFIX@' .. engine_id)
  -- arq's INCR then EXPIRE of the tries; a first try (most jobs) is one SET.
  local tries_key, tries = '@RETRY_PREFIX@' .. engine_id, 1
  if not redis.call('SET', tries_key, '1', 'EX', @RETRY_TTL_S@, 'NX') then
    tries = redis.call('INCR', tries_key)
    redis.call('EXPIRE', tries_key, @RETRY_TTL_S@)
  end
  local aborted = 0
  if P_ABORT ~= '' then
    if p_abort_live == nil then p_abort_live = redis.call('EXISTS', P_ABORT) == 1 end
    if p_abort_live then aborted = redis.call('ZREM', P_ABORT, engine_id) end
  end
  -- A state that makes the start fail (not a hash) fails this job's start alone, not the claim of
  -- the others: the worker then sends the start itself, which reports the error.
  local ok, started = pcall(start_job, P_STATE .. job_id, P_ACTIVE, P_LEASES, job_id, now, now + P_LEASE_MS,
                            P_RETENTION)
  if not ok then started = false end
  return {job or false, tries, aborted, started}
end
