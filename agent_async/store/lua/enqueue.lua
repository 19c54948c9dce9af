-- enqueue: one or many jobs in one call, each queued by enqueue_job.lua (loaded in front of this)
-- with its own checks, all or nothing for it. The concurrent enqueues of several callers share one
-- call (JobStore.create), as do the jobs of ClientAgent.enqueue_many: Redis decodes one argument
-- and sets the script up once, and the writes the jobs share go out once.
-- KEYS: none (the keys are derived from the prefixes below: enqueue_job.lua)
-- ARGV: a JSON list of jobs (each as enqueue_job.lua takes it); '1' to stop at the first job
--       Redis refuses (enqueue_many's contract), '' for jobs each on its own (different callers);
--       state key prefix, active index, all-jobs index, user index prefix, schedule index prefix,
--       owned blobs hash, engine queue, engine job id prefix, index cutoff ms
-- Reply: one enqueue_job reply per job, in order, or the text of a Redis error no check caught.
-- When stopping, the list ends at the job Redis refused (-1 the id exists, -2 a key of the wrong
-- type, or an error's text): the jobs before it are queued, it and those after it are not.

local stop = ARGV[2] == '1'
local replies = {}
enqueue_begin({state_prefix = ARGV[3], active = ARGV[4], all_idx = ARGV[5], user_prefix = ARGV[6],
               schedule_prefix = ARGV[7], owned = ARGV[8], queue = ARGV[9], engine_prefix = ARGV[10],
               cutoff = ARGV[11]})
for i, job in ipairs(cjson.decode(ARGV[1])) do
  local ok, reply = pcall(enqueue_job, job)
  if not ok then reply = error_text(reply) end
  replies[i] = reply
  if stop and (not ok or reply < 0) then break end
end
enqueue_end()
return replies
