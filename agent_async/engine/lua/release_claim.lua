-- release_claim: drop arq's in-progress mark of a job that never started (its worker was lost
-- between claim and pickup), only while the state is still PENDING/RETRY.
-- KEYS: state, in-progress key
-- ARGV: none
-- Reply: 1 released, 0 left alone.

local status = redis.call('HGET', KEYS[1], 'status')
if status == 'PENDING' or status == 'RETRY' then return redis.call('DEL', KEYS[2]) end
return 0
