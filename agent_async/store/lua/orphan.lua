-- orphan: settle a job that no worker holds: STARTED with a lease that ran out (its worker died),
-- or PENDING/RETRY with no engine job. Re-queued under the same id if it may resume; otherwise
-- FAILURE (WorkerLost), or CANCELED if a cancel was pending.
-- KEYS: state, active, leases, engine queue, engine job, engine claim
-- ARGV: job id, now ms, retention s, engine job id, engine job bytes, engine score ms,
--       engine job ttl ms
-- Reply: the status it got, or '' if the job turned out to be alive or already settled.

local state, active, leases, queue, engine_key, claim = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local job_id, now = ARGV[1], tonumber(ARGV[2])
local h = redis.call('HMGET', state, 'status', 'resume', 'max_try', 'attempts', 'cancel_requested_ms', 'name')
local status = h[1]
if not status or is_terminal(status) then return '' end
if status == 'STARTED' then
  local lease = redis.call('ZSCORE', leases, job_id)
  if lease and tonumber(lease) > now then return '' end
elseif engine_has(engine_key) then
  return ''
end
local lost = status == 'STARTED' and 'the worker was lost during attempt ' .. h[4] or 'it was no longer queued'
if h[5] then
  end_job(state, active, leases, job_id, 'CANCELED', now, ARGV[3], 'canceled: ' .. lost)
  engine_drop(queue, engine_key, claim, ARGV[4])
  metric('rec|' .. (h[6] or '') .. '|canceled')
  return 'CANCELED'
end
if may_resume(h[2], h[4], h[3]) then
  redis.call('HSET', state, 'status', 'PENDING', 'updated_ms', now, 'error', WORKER_LOST .. ': ' .. lost .. '; queued again')
  redis.call('ZADD', active, now, job_id)
  redis.call('ZREM', leases, job_id)
  emit(state, job_id, 'PENDING', now)
  if status == 'STARTED' then metric('run_adj|' .. (h[6] or '')) end  -- a run ended, not by its end
  metric('rec|' .. (h[6] or '') .. '|requeued')
  engine_requeue(queue, engine_key, claim, ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  return 'PENDING'
end
end_job(state, active, leases, job_id, 'FAILURE', now, ARGV[3], lost_error(lost, h[2]))
engine_drop(queue, engine_key, claim, ARGV[4])
metric('rec|' .. (h[6] or '') .. '|failed')
return 'FAILURE'
