-- no_pickup: the claim on its own (tests, tools): it only claims, and arq picks each job up itself.
-- KEYS: none of its own (a piece of claim_batch.lua)
-- ARGV: none of its own
local function pickup(engine_id, now) return false end
