-- start: PENDING/RETRY -> STARTED, attempts + 1, lease taken, slot's safety TTL restarted.
-- KEYS: state, active, leases
-- ARGV: job id, now ms, lease expiry ms, retention s, '1' if this call sends again a start whose
--       reply was lost (same now ms: recognised by the state's started_ms)
-- Reply: {attempts, user, name} when the job may run; {-1} no state; {-2, status} already
-- terminal; {-3, status} ended here: a redelivery of a run whose worker was lost, for a job that
-- may not resume (or is out of attempts), or that was asked to cancel.

return {start_job(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1')}
