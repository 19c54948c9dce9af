-- Helpers shared by every store script; loaded in front of each of them, after the engine's
-- library. @NAME@ placeholders are filled in from agent_async.lifecycle when the file is loaded.

local TERMINAL = ',@TERMINAL@,'
local WORKER_LOST = '@WORKER_LOST@'
local PRUNE_BATCH = @PRUNE_BATCH@

local function is_terminal(status)
  return string.find(TERMINAL, ',' .. status .. ',', 1, true) ~= nil
end

-- The resume rule (agent_async.lifecycle.may_resume): an attempt cut short may run again.
local function may_resume(resume, attempts, max_try)
  return resume == '1' and tonumber(attempts or '0') < tonumber(max_try or '1')
end

-- Index entries older than the retention are checked (and dropped if their state expired) a few
-- at a time, so indexes stay bounded without a full scan on any single call.
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

-- Ends a state for good: terminal fields, out of the active index and the leases, slot freed,
-- retention TTL. Every script that can end a job ends it through here.
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

local function lost_error(lost, resume)
  return WORKER_LOST .. ': ' .. lost .. (resume == '1' and ' (no attempts left)' or ' (resume is off)')
end
