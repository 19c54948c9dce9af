-- finish_batch: the end of several runs in one call, each as arq's finish transaction would end it
-- with our outcome in front (the fast worker sent one MULTI/EXEC per run before, or per group of
-- runs: EVALSHA of transition.lua, then arq's DEL and ZREM): the run's transition (the store's
-- transition_job, when the run has an outcome to write), then arq's part: the claim dropped; for a
-- job that is done, its tries, its record and its queue entry too; for a retry, its queue entry
-- moved to the retry's time and an idle worker woken to wait for it. The writes the runs share
-- (index entries, counters, arq's keys) go out as one call per key. Then, for a busy worker, the
-- claim of as many due jobs as it ended runs (claim_lib.lua's claim): the slots they free are
-- refilled without a claim call of their own. Loaded after the store's lib.lua, pickup.lua and
-- claim_lib.lua.
-- KEYS: queue, arq's abort set ('' when aborts are off: nothing reads it then), wake list
-- ARGV: now ms, state key prefix, active index, leases, retention s, then a JSON list of runs:
--       [engine id, job id ('' for no outcome), new status, result JSON, error, undo a start ('1'|''),
--        the attempt it ends (0: any), done (1|0), queued again: its score's increment ms (0: due
--        now; -1: not queued again)],
--       then jobs to claim (0: none) and, when some: in-progress ttl ms, in-progress key prefix,
--       the claim's mark, read limit, jobs the worker holds claimed besides these runs (claim_lib.lua's
--       `held`), then the pickup's (pickup.lua's pickup_setup)
-- Reply: {per run, 1 (0 if its transition found the state already terminal or gone; -1 if its
--        attempt was over: a finish sent again after its reply was lost, arq's part then left
--        alone, since the first send did it and the job may be running again), or the text
--        of the Redis error its transition raised (arq's part of that run was done all the same,
--        as in a MULTI/EXEC: the reconciler settles the state); the claim's reply, or nil}

local queue, abort_set, wake = KEYS[1], KEYS[2], KEYS[3]
local now, state_prefix, active, leases, retention_s = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local replies, dels, done, requeued = {}, {}, {}, false
-- One batch for the runs' ends and the starts of the jobs claimed for their slots: their index
-- entries and counters go out together.
batch_begin()
for i, run in ipairs(cjson.decode(ARGV[6])) do
  local engine_id, job_id = run[1], run[2]
  local reply = 1
  if job_id ~= '' then
    local ok, moved = pcall(transition_job, state_prefix .. job_id, active, leases, job_id, run[3], now,
                            retention_s, run[4], run[5], run[6] == '1', tonumber(run[7]))
    reply = ok and moved or error_text(moved)
  end
  replies[i] = reply
  -- A stale run's claim and queue entry may be the next attempt's now: arq's part is left alone.
  if reply ~= STALE then
    dels[#dels + 1] = '@IN_PROGRESS_PREFIX@' .. engine_id
    if run[8] == 1 then
      dels[#dels + 1] = '@RETRY_PREFIX@' .. engine_id
      dels[#dels + 1] = engine_job_key(engine_id)
      done[#done + 1] = engine_id
    elseif run[9] >= 0 then
      -- Queued again (a retry): due now, or later by its increment; an idle worker wakes for it.
      if run[9] > 0 then redis.call('ZINCRBY', queue, run[9], engine_id) end
      requeued = true
    end
  end
end
variadic('DEL', nil, dels)
if #done > 0 then
  variadic('ZREM', queue, done)
  if abort_set ~= '' then variadic('ZREM', abort_set, done) end
end
if requeued then engine_wake(queue) end
local wanted, claimed = tonumber(ARGV[7]), false
if wanted > 0 then
  pickup_setup(ARGV, 13)
  claimed = claim(queue, wake, tonumber(now), ARGV[8], ARGV[9], ARGV[10], wanted, tonumber(ARGV[11]), false,
                  tonumber(ARGV[12]))
end
batch_end()
return {replies, claimed}
