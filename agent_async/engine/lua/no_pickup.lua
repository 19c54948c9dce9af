-- no_pickup: the claim on its own (tests, tools): it only claims, and arq picks each job up itself.
-- KEYS: none of its own (a piece of claim_batch.lua)
-- ARGV: none of its own
-- pickup_all appends what pickup.lua's does for a job it does not pick up.
local function pickup_setup(args, first) end
local function pickup_all(engine_ids, scores, now, reply)
  for i, engine_id in ipairs(engine_ids) do engine_not_picked(reply, engine_id, scores[i]) end
end
