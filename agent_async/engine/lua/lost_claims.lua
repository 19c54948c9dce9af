-- lost_claims: the jobs taken by claim calls whose reply never reached their worker (the
-- connection dropped after Redis ran the call): started, in progress, and run by no one. They are
-- found by the mark each claim call writes in its jobs' in-progress keys (claim_lib.lua), among
-- the jobs holding a lease (every claimed job that the claim also started). Read only: the worker
-- hands each one back as it does any claimed job it will not run.
-- KEYS: leases
-- ARGV: in-progress key prefix of this namespace's engine jobs, the lost calls' marks (JSON list)
-- Reply: their job ids

local lost = {}
for _, mark in ipairs(cjson.decode(ARGV[2])) do lost[mark] = true end
local found = {}
for _, job_id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local mark = redis.call('GET', ARGV[1] .. job_id)
  if mark and lost[mark] then found[#found + 1] = job_id end
end
return found
