-- start: PENDING/RETRY -> STARTED, attempts + 1, lease taken, slot's safety TTL restarted.
-- KEYS: state, active, leases
-- ARGV: job id, now ms, lease expiry ms, retention s
-- Reply: {attempts, user, name} when the job may run; {-1} no state; {-2, status} already
-- terminal; {-3, status} ended here: a redelivery of a run whose worker was lost, for a job that
-- may not resume (or is out of attempts), or that was asked to cancel.

local state, active, leases = KEYS[1], KEYS[2], KEYS[3]
local job_id, now = ARGV[1], tonumber(ARGV[2])
local h = redis.call('HMGET', state, 'status', 'user', 'name', 'gate', 'gate_ttl_ms', 'resume', 'max_try',
                     'attempts', 'cancel_requested_ms', 'updated_ms', 'error')
if not h[1] then return {-1} end
if is_terminal(h[1]) then return {-2, h[1]} end
if h[1] == 'STARTED' then
  -- The engine redelivered a run that never finished: its worker was lost.
  if h[9] then
    end_job(state, active, leases, job_id, 'CANCELED', now, ARGV[4], 'canceled: its worker was lost while it ran')
    metric('rec|' .. (h[3] or '') .. '|canceled')
    return {-3, 'CANCELED'}
  end
  if not may_resume(h[6], h[8], h[7]) then
    end_job(state, active, leases, job_id, 'FAILURE', now, ARGV[4],
            lost_error('the worker was lost during attempt ' .. h[8], h[6]))
    metric('rec|' .. (h[3] or '') .. '|failed')
    return {-3, 'FAILURE'}
  end
  metric('rec|' .. (h[3] or '') .. '|resumed')
else
  -- From the queue: how long it waited since it was queued (its count is also a run started).
  observe('wait', h[3] or '', now - tonumber(h[10] or now))
end
local attempts = redis.call('HINCRBY', state, 'attempts', 1)
redis.call('HSET', state, 'status', 'STARTED', 'started_ms', now, 'updated_ms', now)
emit_known(job_id, 'STARTED', now, h[3], h[2], attempts, h[11])
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
