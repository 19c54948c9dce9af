-- claim_batch: claim up to N due jobs in one call and pick them up (claim_lib.lua's claim, with
-- pickup.lua's pickup_all, or no_pickup.lua's when the claim only claims). Loaded after queue.lua,
-- one of those two, and claim_lib.lua.
-- KEYS: queue, wake list
-- ARGV: now ms (or "now": Redis's clock, for a claim queued behind a blocking wait), in-progress
--       ttl ms, in-progress key prefix, the claim's mark, jobs wanted, read limit, jobs the worker
--       holds claimed (claim_lib.lua's `held`), then the pickup's (pickup.lua)
-- Reply: claim_lib.lua's claim's

local now = tonumber(ARGV[1])
if ARGV[1] == 'now' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
pickup_setup(ARGV, 8)
return claim(KEYS[1], KEYS[2], now, ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), true,
             tonumber(ARGV[7]))
