-- cancel: a job not started yet is CANCELED at once and taken out of the engine's queue (it never
-- runs); a running one is flagged and announced to the workers, and the one running it stops it.
-- KEYS: state, active, leases, engine queue, engine job
-- ARGV: job id, now ms, retention s, engine job id, cancel channel
-- Reply: '' no such job; 'REQUESTED' running (flagged); otherwise the status after the call.

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
engine_drop(queue, engine_key, '', ARGV[4])
return 'CANCELED'
