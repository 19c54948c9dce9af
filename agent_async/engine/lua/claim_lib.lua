-- claim_lib: the batch claim as a function, for the claim script (claim_batch.lua) and for the
-- finish of runs, which claims jobs for the slots its runs free (finish_batch.lua). Loaded after
-- queue.lua and pickup.lua (or no_pickup.lua).
-- claim(queue, wake list, now ms, in-progress ttl ms, in-progress key prefix, mark, jobs wanted,
-- read limit, idle, held) claims up to `wanted` due jobs (arq's claim of each: not in progress, due, then
-- marked in progress; arq spends four round trips per job on it), picks them up (pickup_all), and,
-- for a worker that will go idle if it found fewer (`idle`), drops the stale wake-up tokens and
-- tells it how long it may wait. A claim for a busy worker's freed slots (the finish's) leaves the
-- tokens alone: an idle worker may still need them, for a job due later. Each job's in-progress
-- key holds `mark` (arq writes '1', and only ever tests the key's existence): the worker's name for
-- this claim call, by which it finds the jobs of a call whose reply it never got (lost_claims.lua).
-- Reply: {next, then per job pickup_all's nine values: engine id, score, ...}. next: -1
--        the batch is full and more due jobs may wait; -2 the read limit was all jobs claimed
--        elsewhere (poll again soon); otherwise the score of the next deferred job, 0 if none.
-- The queue is read for due jobs only, without their scores: Redis 7.0 writes each score of a
-- reply with printf("%.17g"), and a page of a busy queue is mostly jobs claimed already. The
-- scores of the jobs taken are read after (ZMSCORE), and the next deferred job's only by a claim
-- that finds too few to take.

-- The first page's length at least (see claim).
local MIN_PAGE = 4

local function claim(queue, wake, now, ttl_ms, prefix, mark, wanted, limit, idle, held)
  local ids = {}
  local claimed = 0
  local now_text = string.format('%d', now)
  -- Read the due jobs a page at a time, by rank (lowest score first): a worker with one free slot
  -- looks at a few entries, not at the whole read limit (arq reads it all at every poll). arq keeps
  -- a claimed job in its queue until it finishes, so the running jobs come first: the first page
  -- is the jobs wanted plus those this worker runs (`held`), and each next one twice as long, past
  -- other workers' (each entry read costs Redis a read of its in-progress key). `limit` bounds how
  -- many due ones are looked at in all.
  local page = math.max(wanted + (held or 0), MIN_PAGE)
  local read, more = 0, false
  while claimed < wanted and read < limit do
    local n = math.min(page, limit - read)
    local entries = redis.call('ZRANGEBYSCORE', queue, '-inf', now_text, 'LIMIT', read, n + 1)  -- n + 1: more?
    more = #entries > n
    local last = math.min(#entries, n)
    -- Which of the page's jobs are claimed already (arq keeps a claimed job in its queue until it
    -- finishes: the running ones come first), in one call instead of a refused SET NX each.
    local claim_keys = {}
    for i = 1, last do claim_keys[i] = prefix .. entries[i] end
    local in_progress = last > 0 and redis.call('MGET', unpack(claim_keys)) or {}
    local i = 1
    while i <= last and claimed < wanted do
      if not in_progress[i] then
        -- arq's EXISTS then PSETEX, in one call (the script is atomic: what MGET saw holds).
        redis.call('SET', claim_keys[i], mark, 'PX', ttl_ms)
        claimed = claimed + 1
        ids[claimed] = entries[i]
      end
      i = i + 1
    end
    if i <= last then more = true end
    read = read + n
    page = 2 * page
    if not more then break end
  end
  local reply = {0}
  if claimed > 0 then pickup_all(ids, redis.call('ZMSCORE', queue, unpack(ids)), now, reply) end
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
  if not idle then return reply end
  -- Nothing more is claimable now: every token in the wake list announced a job that is claimed or
  -- deferred (and this worker waits for the next deferred one itself), so they are all stale.
  redis.call('DEL', wake)
  local next_due = redis.call('ZRANGEBYSCORE', queue, '(' .. now_text, '+inf', 'LIMIT', 0, 1, 'WITHSCORES')
  reply[1] = next_due[2] and tonumber(next_due[2]) or 0
  return reply
end
