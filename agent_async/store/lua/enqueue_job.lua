-- enqueue_job: persist a PENDING state, take its concurrency slot, index it and queue the engine job,
-- all or nothing: a refused enqueue writes nothing (its checks come first, or are undone).
-- One job of enqueue.lua's call, between enqueue_begin() and enqueue_end(): the writes its jobs
-- share (their index entries after each key's first, the enqueue counts and the index pruning
-- they pace, the wake-up tokens) are collected and sent once for all at the end.
-- KEYS: state, active, user index|'', schedule index|'', gate|'', engine queue, engine job,
--       owned blobs hash|''  (when the state has an owned_blobs field), all-jobs index
-- ARGV: job id, now ms, gate limit, gate slot expiry ms, engine job id, engine score ms,
--       engine job bytes, engine job ttl ms, state key prefix, index cutoff ms,
--       then the state's hash field/value pairs
-- Reply: 1 queued, 0 gate full, -1 the id exists, -2 a key has the wrong type

-- The call's shared writes: the keys known to be zsets, the enqueue counts by job name, the indexes
-- to prune, the wake-up tokens by queue.
local Q = nil

local function enqueue_begin()
  batch_begin()
  Q = {zsets = {}, counts = {}, count_order = {}, prunes = {}, prune_order = {}, woken = {}}
end

-- One job's zset entries, all or none. A key's first write in the call goes at once, through
-- pcall: a key of the wrong type refuses the job, and what it wrote is undone (a TYPE check of each
-- key first cost one call per key and job). Later writes to a key known to be a zset are collected.
local function write_zsets(zsets)
  local written = {}
  for _, z in ipairs(zsets) do
    if z[1] ~= '' and not Q.zsets[z[1]] then
      local reply = redis.pcall('ZADD', z[1], z[2], z[3])
      if type(reply) == 'table' and reply.err then
        for _, w in ipairs(written) do redis.call('ZREM', w[1], w[3]) end
        return false
      end
      written[#written + 1] = z
    end
  end
  for _, z in ipairs(zsets) do
    if Q.zsets[z[1]] then zadd_later(z[1], z[2], z[3]) end
  end
  for _, w in ipairs(written) do Q.zsets[w[1]] = true end
  return true
end

local function count_later(name, all_idx, prefix, cutoff)
  local c = Q.counts[name]
  if not c then
    c = {by = 0, all_idx = all_idx, prefix = prefix, cutoff = cutoff}
    Q.counts[name] = c
    Q.count_order[#Q.count_order + 1] = name
  end
  c.by = c.by + 1
end

local function prune_later(index, prefix, cutoff)
  if index == '' then return end
  local p = Q.prunes[index]
  if not p then
    p = {by = 0, prefix = prefix, cutoff = cutoff}
    Q.prunes[index] = p
    Q.prune_order[#Q.prune_order + 1] = index
  end
  p.by = p.by + 1
end

local function enqueue_job(KEYS, ARGV)
  local state, active, user_idx, sched_idx, gate, queue, engine_key, owned, all_idx =
    KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
  local job_id, now = ARGV[1], tonumber(ARGV[2])
  if engine_has(engine_key, state) then return -1 end
  local limit = tonumber(ARGV[3])
  local gated = gate ~= '' and limit > 0
  if gated then
    if not zset_or_none(gate) then return -2 end
    redis.call('ZREMRANGEBYSCORE', gate, '-inf', now)
    if redis.call('ZCARD', gate) >= limit then
      metric('gate|' .. field_value(ARGV, 11, 'name'))
      return 0
    end
  end
  local name = field_value(ARGV, 11, 'name')
  -- The engine's queue is one of the checked zset writes (no TYPE call for it either).
  local q_key, q_score, q_member = engine_queue_entry(queue, ARGV[5], ARGV[6])
  local zsets = {
    {q_key, q_score, q_member}, {active, now, job_id}, {all_idx, now, job_id},
    {idx_key(active, 'name:' .. name), now, job_id}, {user_idx, now, job_id}, {sched_idx, now, job_id},
  }
  if not write_zsets(zsets) then return -2 end
  local fields = {}
  for i = 11, #ARGV do fields[#fields + 1] = ARGV[i] end
  fields[#fields + 1] = 'updated_ms'; fields[#fields + 1] = now
  if gated then
    fields[#fields + 1] = 'gate'; fields[#fields + 1] = gate
    fields[#fields + 1] = 'gate_ttl_ms'; fields[#fields + 1] = tonumber(ARGV[4]) - now
  end
  redis.call('HSET', state, unpack(fields))
  emit_known(job_id, 'PENDING', now, name, field_value(ARGV, 11, 'user'), field_value(ARGV, 11, 'attempts'),
             field_value(ARGV, 11, 'error'))
  if gated then
    redis.call('ZADD', gate, tonumber(ARGV[4]), job_id)
    if redis.call('PTTL', gate) < tonumber(ARGV[4]) - now then redis.call('PEXPIREAT', gate, tonumber(ARGV[4])) end
  end
  if owned ~= '' then redis.call('HSET', owned, job_id, redis.call('HGET', state, 'owned_blobs')) end
  engine_store(queue, engine_key, ARGV[7], ARGV[8], false)
  Q.woken[queue] = (Q.woken[queue] or 0) + 1
  count_later(name, all_idx, ARGV[9], ARGV[10])
  prune_later(user_idx, ARGV[9], ARGV[10])
  prune_later(sched_idx, ARGV[9], ARGV[10])
  return 1
end

-- Sends what the call's jobs share, and ends it.
local function enqueue_end()
  local q = Q
  Q = nil
  batch_end()
  -- Every job's index gains an entry with each enqueue: the count of enqueues paces its pruning.
  for _, name in ipairs(q.count_order) do
    local c = q.counts[name]
    prune(c.all_idx, c.prefix, c.cutoff, metric('enq|' .. name, c.by), c.by)
  end
  -- A user's (or schedule's) index is pruned with each of its enqueues: paced by the count of all
  -- enqueues of this name, a user who rarely enqueues would keep their expired entries for long.
  for _, index in ipairs(q.prune_order) do
    local p = q.prunes[index]
    prune(index, p.prefix, p.cutoff, nil, p.by)
  end
  for queue, jobs in pairs(q.woken) do engine_wake(queue, jobs) end
end
