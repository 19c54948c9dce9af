-- transition: move a non-terminal state to a new status; a terminal state is never overwritten.
-- KEYS: state, active, leases
-- ARGV: job id, new status, now ms, retention s, result json|'', error|'',
--       '1' to undo a start that never ran
-- Reply: 1 if the transition happened, else 0.

local state, active, leases = KEYS[1], KEYS[2], KEYS[3]
local job_id, new_status, now = ARGV[1], ARGV[2], ARGV[3]
-- end_job's read, done here: one HMGET for both (kept in step with the changes below).
local h = redis.call('HMGET', state, unpack(END_FIELDS))
local current = h[4]
if not current or is_terminal(current) then return 0 end
if ARGV[6] == '' and h[8] then redis.call('HDEL', state, 'error'); h[8] = false end
if ARGV[7] == '1' and current == 'STARTED' then
  -- Marked STARTED in the pickup transaction, but the engine dropped the job before running it.
  h[7] = redis.call('HINCRBY', state, 'attempts', -1)
  redis.call('HDEL', state, 'started_ms')
  h[5] = false
end
if is_terminal(new_status) then
  end_job(state, active, leases, job_id, new_status, now, ARGV[4], ARGV[6], ARGV[5], h)
else
  if ARGV[5] ~= '' then redis.call('HSET', state, 'result', ARGV[5]) end
  redis.call('HSET', state, 'status', new_status, 'updated_ms', now)
  if ARGV[6] ~= '' then redis.call('HSET', state, 'error', ARGV[6]) end
  emit_known(job_id, new_status, now, h[3], h[6], h[7], ARGV[6])  -- its error is ARGV[6] now, or none
  -- jobs_in_progress is derived (agent_async.metrics.layout.Field.IN_PROGRESS_ADJUST): a retry
  -- ends a run; any other way out of STARTED, or into it, is an adjustment (rare paths only).
  local name, left = h[3] or '', current == 'STARTED' and new_status ~= 'STARTED'
  if new_status == 'RETRY' then
    metric('retry|' .. name)
    if not left then metric('run_adj|' .. name, -1) end
  elseif left then
    metric('run_adj|' .. name)
  end
  if current ~= 'STARTED' and new_status == 'STARTED' then metric('run_adj|' .. name, -1) end
  redis.call('ZADD', active, now, job_id)
  if new_status ~= 'STARTED' then redis.call('ZREM', leases, job_id) end
end
return 1
