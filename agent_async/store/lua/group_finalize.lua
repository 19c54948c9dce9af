-- group_finalize: queue the finalizer of a group whose finalizer could not be queued when its last
-- child ended (the recovery pass calls this for each group in the pending-finalizer index).
-- KEYS: group, active index
-- ARGV: now ms, retention s
-- Reply: 1 queued now, 0 not pending (already queued, or no such group), -1 failed again.

local group, active = KEYS[1], KEYS[2]
if redis.call('HGET', group, 'status') ~= 'final_pending' then return 0 end
if try_finalize(group, active, ARGV[1], ARGV[2]) then return 1 end
return -1
