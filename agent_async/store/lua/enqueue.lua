-- enqueue: one or many jobs in one call, each queued by enqueue_job.lua (loaded in front of this)
-- with its own checks, all or nothing for it. The concurrent enqueues of several callers share one
-- call (JobStore.create), as do the jobs of ClientAgent.enqueue_many: Redis decodes one argument
-- and sets the script up once, and the writes the jobs share go out once.
-- KEYS: none (each job's own are in ARGV[1])
-- ARGV: a JSON list of [keys, args], one per job, as enqueue_job's; '1' to stop at the first job
--       Redis refuses (enqueue_many's contract), '' for jobs each on its own (different callers)
-- Reply: one enqueue_job reply per job, in order, or the text of a Redis error no check caught.
-- When stopping, the list ends at the job Redis refused (-1 the id exists, -2 a key of the wrong
-- type, or an error's text): the jobs before it are queued, it and those after it are not.

local stop = ARGV[2] == '1'
local replies = {}
enqueue_begin()
for i, job in ipairs(cjson.decode(ARGV[1])) do
  local ok, reply = pcall(enqueue_job, job[1], job[2])
  if not ok then reply = type(reply) == 'table' and (reply.err or 'error') or tostring(reply) end
  replies[i] = reply
  if stop and (not ok or reply < 0) then break end
end
enqueue_end()
return replies
