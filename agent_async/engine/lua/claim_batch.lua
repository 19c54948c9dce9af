-- claim_batch: claim up to N due jobs in one call (arq's claim of each: not in progress, due, then
-- marked in progress; arq spends four round trips per job on it), pick them up (pickup.lua's
-- pickup_all, or no_pickup.lua's when the claim only claims), and tell the worker how long it may
-- wait when it found fewer. Loaded after queue.lua and one of those two.
-- KEYS: queue, wake list
-- ARGV: now ms (or "now": Redis's clock, for a claim queued behind a blocking wait), in-progress
--       ttl ms, in-progress key prefix, jobs wanted, read limit
-- Reply: {next, engine id, score, pickup, engine id, score, pickup, ...} (pickup: pickup_all's,
--        nil for a job arq picks up itself). next: -1 the batch is full and more due
--        jobs may wait; -2 the read limit was all jobs claimed elsewhere (poll again soon);
--        otherwise the score of the next deferred job, 0 if there is none.

local queue, wake = KEYS[1], KEYS[2]
local now, ttl_ms, prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3]
if ARGV[1] == 'now' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local wanted, limit = tonumber(ARGV[4]), tonumber(ARGV[5])
local ids, scores = {}, {}
local claimed = 0
-- Read the due jobs a page at a time: a worker with one free slot looks at a few entries, not at
-- the whole read limit (arq reads it all at every poll). Entries claimed by other workers are
-- skipped; `limit` bounds how many are looked at in all.
local page = math.max(2 * wanted, 16)
local read, more = 0, false
while claimed < wanted and read < limit do
  local n = math.min(page, limit - read)
  local due = redis.call('ZRANGEBYSCORE', queue, '-inf', now, 'WITHSCORES', 'LIMIT', read, n + 1)
  more = #due > 2 * n  -- the extra entry: is anything due after this page?
  local last = math.min(#due, 2 * n)
  local i = 1
  while i < last and claimed < wanted do
    local claim = prefix .. due[i]
    if redis.call('SET', claim, '1', 'PX', ttl_ms, 'NX') then  -- arq's EXISTS then PSETEX, in one call
      claimed = claimed + 1
      ids[claimed] = due[i]
      scores[claimed] = due[i + 1]
    end
    i = i + 2
  end
  if i < last then more = true end
  read = read + n
  if not more then break end
end
local reply = {0}
for i, picked in ipairs(pickup_all(ids, now)) do
  reply[#reply + 1] = ids[i]
  reply[#reply + 1] = scores[i]
  reply[#reply + 1] = picked
end
if claimed == wanted then
  if more then
    -- More may be due than this worker takes: wake another idle worker to share them (unless a
    -- token already waits: then no worker is idle, or one is about to wake).
    reply[1] = -1
    if redis.call('LLEN', wake) == 0 then engine_wake(queue) end
  end
  return reply
end
if more then
  -- The read limit was all jobs claimed elsewhere, and more are due: poll again soon.
  reply[1] = -2
  return reply
end
-- Nothing more is claimable now: every token in the wake list announced a job that is claimed or
-- deferred (and this worker waits for the next deferred one itself), so they are all stale.
redis.call('DEL', wake)
local next_job = redis.call('ZRANGEBYSCORE', queue, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if next_job[2] then reply[1] = tonumber(next_job[2]) end
return reply
