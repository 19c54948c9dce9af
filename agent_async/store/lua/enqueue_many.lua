-- enqueue_many: many jobs in one call (ClientAgent.enqueue_many), each exactly as enqueue.lua
-- queues it alone: its own checks, all or nothing for it (enqueue_job.lua, loaded in front of this).
-- One call instead of one per job saves Redis each job's script set-up and argument decoding, and
-- the batch drops its wake-up tokens once.
-- KEYS: none (each job's own are in ARGV[1])
-- ARGV: a JSON list of [keys, args], one per job, as enqueue.lua's
-- Reply: one enqueue_job reply per job, in order. The batch stops at a job Redis refuses (-1 the
-- id exists, -2 a key of the wrong type; or a Redis error no check caught: then its text is the
-- last reply): the jobs before it are queued, it and those after it are not.

local replies, woken = {}, {}
for i, job in ipairs(cjson.decode(ARGV[1])) do
  local ok, reply = pcall(enqueue_job, job[1], job[2], false)
  if not ok then
    replies[i] = type(reply) == 'table' and (reply.err or 'error') or tostring(reply)
    break
  end
  replies[i] = reply
  if reply < 0 then break end
  if reply == 1 then
    local queue = job[1][6]
    woken[queue] = (woken[queue] or 0) + 1
  end
end
for queue, jobs in pairs(woken) do engine_wake(queue, jobs) end
return replies
