-- claim: arq's claim of a queued job as one script: not already in progress, due, then mark it
-- in progress. arq does the same with WATCH, EXISTS, ZSCORE and MULTI/EXEC: four round trips.
-- KEYS: in-progress key, queue
-- ARGV: now ms, in-progress ttl ms, engine job id
-- Reply: the job's score, or nil if it is not claimable now.

if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local score = redis.call('ZSCORE', KEYS[2], ARGV[3])
if not score or tonumber(score) > tonumber(ARGV[1]) then return false end
redis.call('PSETEX', KEYS[1], ARGV[2], '1')
return score
