-- no_pickup: the claim on its own (tests, tools): it only claims, and arq picks each job up itself.
-- KEYS: none of its own (a piece of claim_batch.lua)
-- ARGV: none of its own
-- pickup_all appends what pickup.lua's does for a job it does not pick up.
local function pickup_setup(args, first) end
local function pickup_all(engine_ids, scores, now, reply)
  for i, engine_id in ipairs(engine_ids) do
    local n = #reply
    reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4], reply[n + 5] = engine_id, scores[i], 0, false, false
    reply[n + 6], reply[n + 7], reply[n + 8], reply[n + 9] = false, false, false, false
  end
end
