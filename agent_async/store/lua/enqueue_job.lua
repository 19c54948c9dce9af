-- enqueue_job: persist a PENDING state, take its concurrency slot, index it and queue the engine job,
-- all or nothing: a refused enqueue writes nothing (its checks come first, or are undone).
-- The job's part of enqueue.lua (one job) and enqueue_many.lua (a batch in one call).
-- KEYS: state, active, user index|'', schedule index|'', gate|'', engine queue, engine job,
--       owned blobs hash|''  (when the state has an owned_blobs field), all-jobs index
-- ARGV: job id, now ms, gate limit, gate slot expiry ms, engine job id, engine score ms,
--       engine job bytes, engine job ttl ms, state key prefix, index cutoff ms,
--       then the state's hash field/value pairs
-- wake: whether to drop the job's wake-up token (a batch drops them once for all its jobs)
-- Reply: 1 queued, 0 gate full, -1 the id exists, -2 a key has the wrong type

local function enqueue_job(KEYS, ARGV, wake)
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
  -- The zsets are written first, each through pcall: one of the wrong type undoes those before it
  -- and refuses the enqueue with nothing written (a TYPE check of each first cost Redis one call
  -- per zset on every enqueue). The engine's queue is one of them.
  local q_key, q_score, q_member = engine_queue_entry(queue, ARGV[5], ARGV[6])
  local zsets = {
    {q_key, q_score, q_member}, {active, now, job_id}, {all_idx, now, job_id},
    {idx_key(active, 'name:' .. name), now, job_id}, {user_idx, now, job_id}, {sched_idx, now, job_id},
  }
  for i, z in ipairs(zsets) do
    if z[1] ~= '' then
      local reply = redis.pcall('ZADD', z[1], z[2], z[3])
      if type(reply) == 'table' and reply.err then
        for j = 1, i - 1 do
          if zsets[j][1] ~= '' then redis.call('ZREM', zsets[j][1], zsets[j][3]) end
        end
        return -2
      end
    end
  end
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
  local enqueued = metric('enq|' .. name)
  if gated then
    redis.call('ZADD', gate, tonumber(ARGV[4]), job_id)
    if redis.call('PTTL', gate) < tonumber(ARGV[4]) - now then redis.call('PEXPIREAT', gate, tonumber(ARGV[4])) end
  end
  if owned ~= '' then redis.call('HSET', owned, job_id, redis.call('HGET', state, 'owned_blobs')) end
  engine_store(queue, engine_key, ARGV[7], ARGV[8], wake)
  -- A user's (or schedule's) index is pruned at each of its enqueues: paced by the count of all
  -- enqueues of this name, a user who rarely enqueues would keep their expired entries for long.
  prune(user_idx, ARGV[9], ARGV[10])
  prune(all_idx, ARGV[9], ARGV[10], enqueued)  -- every job's index: paced by the enqueue count
  prune(sched_idx, ARGV[9], ARGV[10])
  return 1
end
