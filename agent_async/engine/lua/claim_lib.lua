-- claim_lib: the batch claim as a function, for the claim script (claim_batch.lua) and for the
-- finish of runs, which claims jobs for the slots its runs free (finish_batch.lua). Loaded after
-- queue.lua and pickup.lua (or no_pickup.lua).
-- claim(queue, wake list, now ms, in-progress ttl ms, in-progress key prefix, mark, jobs wanted,
-- read limit, idle) claims up to `wanted` due jobs (arq's claim of each: not in progress, due, then
-- marked in progress; arq spends four round trips per job on it), picks them up (pickup_all), and,
-- for a worker that will go idle if it found fewer (`idle`), drops the stale wake-up tokens and
-- tells it how long it may wait. A claim for a busy worker's freed slots (the finish's) leaves the
-- tokens alone: an idle worker may still need them, for a job due later. Each job's in-progress
-- key holds `mark` (arq writes '1', and only ever tests the key's existence): the worker's name for
-- this claim call, by which it finds the jobs of a call whose reply it never got (lost_claims.lua).
-- Reply: {next, engine id, score, pickup, engine id, score, pickup, ...} (pickup: pickup_all's,
--        nil for a job arq picks up itself). next: -1 the batch is full and more due
--        jobs may wait; -2 the read limit was all jobs claimed elsewhere (poll again soon);
--        otherwise the score of the next deferred job, 0 if there is none.

local function claim(queue, wake, now, ttl_ms, prefix, mark, wanted, limit, idle)
  local ids, scores = {}, {}
  local claimed = 0
  -- Read the queue a page at a time, by rank (lowest score first: the due jobs, then the deferred
  -- ones): a worker with one free slot looks at a few entries, not at the whole read limit (arq
  -- reads it all at every poll). Entries claimed by other workers are skipped; `limit` bounds how
  -- many due ones are looked at in all. A page that runs into a deferred job also tells when the
  -- next one is due, so an idle worker's claim reads the queue once, not twice.
  local page = math.max(2 * wanted, 16)
  local read, more, next_ms = 0, false, 0
  while claimed < wanted and read < limit do
    local n = math.min(page, limit - read)
    local entries = redis.call('ZRANGE', queue, read, read + n, 'WITHSCORES')  -- n + 1 entries
    -- The due prefix of the page; the extra entry says whether anything is due after it.
    local due = 0
    while due < #entries and tonumber(entries[due + 2]) <= now do due = due + 2 end
    if due < #entries then next_ms = tonumber(entries[due + 2]) end
    more = due > 2 * n
    local last = math.min(due, 2 * n)
    -- Which of the page's jobs are claimed already (arq keeps a claimed job in its queue until it
    -- finishes: the running ones come first), in one call instead of a refused SET NX each.
    local claim_keys = {}
    for i = 1, last - 1, 2 do claim_keys[#claim_keys + 1] = prefix .. entries[i] end
    local held = #claim_keys > 0 and redis.call('MGET', unpack(claim_keys)) or {}
    local i, k = 1, 1
    while i < last and claimed < wanted do
      if not held[k] then
        -- arq's EXISTS then PSETEX, in one call (the script is atomic: what MGET saw holds).
        redis.call('SET', claim_keys[k], mark, 'PX', ttl_ms)
        claimed = claimed + 1
        ids[claimed] = entries[i]
        scores[claimed] = entries[i + 1]
      end
      i, k = i + 2, k + 1
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
  if not idle then return reply end
  -- Nothing more is claimable now: every token in the wake list announced a job that is claimed or
  -- deferred (and this worker waits for the next deferred one itself), so they are all stale. The
  -- last page ran past the due jobs: its first deferred entry, if any, is the next one due.
  redis.call('DEL', wake)
  reply[1] = next_ms
  return reply
end
