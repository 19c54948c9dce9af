-- no_pickup: the claim on its own (tests, tools): it only claims, and arq picks each job up itself.
-- KEYS: none of its own (a piece of claim_batch.lua)
-- ARGV: none of its own
local function pickup_setup(args, first) end
local function pickup_all(engine_ids, now)
  local out = {}
  for i = 1, #engine_ids do out[i] = false end
  return out
end
