-- release_claim: drop arq's in-progress mark of a job that never started (its worker was lost
-- between claim and pickup), only while the state is still PENDING/RETRY, and wake an idle worker
-- for it (nothing else would signal it: it sat in the queue all along). Loaded after queue.lua.
-- KEYS: state, in-progress key, queue
-- ARGV: none
-- Reply: 1 released, 0 left alone.

local status = redis.call('HGET', KEYS[1], 'status')
if (status == 'PENDING' or status == 'RETRY') and redis.call('DEL', KEYS[2]) == 1 then
  engine_wake(KEYS[3])
  return 1
end
return 0
