-- enqueue_job: persist a PENDING state, take its concurrency slot, index it and queue the engine job,
-- all or nothing: a refused enqueue writes nothing (its checks come first, or are undone).
-- One job of enqueue.lua's call, between enqueue_begin(C) and enqueue_end(): the writes its jobs
-- share (their index entries after each key's first, the enqueue counts and the index pruning
-- they pace, the wake-up tokens) are collected and sent once for all at the end. Each job's keys
-- and its engine record are derived here from the call's constants and the job's own fields.
-- KEYS: none (the call's constants C: enqueue_begin's)
-- ARGV: none (the job, a list: job id, created ms, job name, payload JSON, user|'', schedule|'',
--       gate key|'', gate limit, gate slot expiry ms, engine score ms, engine job ttl ms,
--       resume '1'|'0', max_try, owned blobs JSON|'', the id check ('1' drawn at random, '0'
--       chosen, '2' sent again: below), then the state's other field/value pairs)
-- Reply: 1 queued, 0 gate full, -1 the id exists, -2 a key has the wrong type

-- The call's shared writes: the keys known to be zsets, the enqueue counts by job name, the indexes
-- to prune (each tallied), the wake-up tokens.
local Q = nil
-- The call's constants: keys and prefixes of this namespace, and the index cutoff (ms).
local C = nil

local function enqueue_begin(constants)
  batch_begin()
  C = constants
  Q = {zsets = {}, counts = {}, count_order = {}, prunes = {}, prune_order = {}, woken = 0, per_name = {}}
end

-- One job's zset entries, all or none: `zsets` holds (key, score, member) triples in a row. A key's
-- first write in the call goes at once, through pcall: a key of the wrong type refuses the job, and
-- what it wrote is undone (a TYPE check of each key first cost one call per key and job). Later
-- writes to a key known to be a zset are collected.
local function write_zsets(zsets)
  local written = nil
  for i = 1, #zsets, 3 do
    local key = zsets[i]
    if key ~= '' and not Q.zsets[key] then
      local reply = redis.pcall('ZADD', key, zsets[i + 1], zsets[i + 2])
      if type(reply) == 'table' and reply.err then
        if written then
          for _, w in ipairs(written) do redis.call('ZREM', zsets[w], zsets[w + 2]) end
        end
        return false
      end
      written = written or {}
      written[#written + 1] = i
    end
  end
  for i = 1, #zsets, 3 do
    if Q.zsets[zsets[i]] then zadd_later(zsets[i], zsets[i + 1], zsets[i + 2]) end
  end
  if written then
    for _, w in ipairs(written) do Q.zsets[zsets[w]] = true end
  end
  return true
end

-- What the call's jobs of one name share, built at its first: the job-type index and the maker of
-- arq's records (queue.lua's engine_job_record).
local function of_name(name)
  local shared = Q.per_name[name]
  if not shared then
    shared = {index = idx_key(C.active, 'name:' .. name), record = engine_job_record(name)}
    Q.per_name[name] = shared
  end
  return shared
end

local function enqueue_job(job)
  -- created: the creation ms as text (what the writes below take); now: the same, as a number.
  local job_id, created, name, payload, user, schedule = job[1], job[2], job[3], job[4], job[5], job[6]
  local now = tonumber(created)
  local gate, limit, gate_expiry, score, ttl_ms = job[7], tonumber(job[8]), job[9], job[10], job[11]
  local state, engine_id = C.state_prefix .. job_id, C.engine_prefix .. job_id
  local engine_key = engine_job_key(engine_id)
  -- job[15], the id check (store/enqueue.py's IdCheck): '1' a drawn id (not checked), '0' a chosen
  -- id (refused if it exists), '2' a resend: a state of this id created at this very ms is the
  -- earlier send's, which ran though its reply was lost, so the job is queued (once, by it).
  if job[15] ~= '1' and engine_has(engine_key, state) then
    if job[15] == '2' and redis.call('HGET', state, 'created_ms') == job[2] then return 1 end
    return -1
  end
  local gated = gate ~= '' and limit > 0
  if gated then
    if not zset_or_none(gate) then return -2 end
    redis.call('ZREMRANGEBYSCORE', gate, '-inf', created)
    if redis.call('ZCARD', gate) >= limit then
      metric('gate|' .. name)
      return 0
    end
  end
  local user_idx = user ~= '' and C.user_prefix .. user or ''
  local sched_idx = schedule ~= '' and C.schedule_prefix .. schedule or ''
  -- The engine's queue is one of the checked zset writes (no TYPE call for it either).
  local q_key, q_score, q_member = engine_queue_entry(C.queue, engine_id, score)
  local shared = of_name(name)
  local zsets = {q_key, q_score, q_member, C.active, created, job_id, C.all_idx, created, job_id,
                 shared.index, created, job_id, user_idx, created, job_id, sched_idx, created, job_id}
  if not write_zsets(zsets) then return -2 end
  local fields = {'name', name, 'status', 'PENDING', 'payload', payload, 'attempts', '0', 'created_ms', job[2],
                  'resume', job[12], 'max_try', job[13], 'updated_ms', job[2]}
  if user ~= '' then fields[#fields + 1] = 'user'; fields[#fields + 1] = user end
  if schedule ~= '' then fields[#fields + 1] = 'schedule'; fields[#fields + 1] = schedule end
  if job[14] ~= '' then fields[#fields + 1] = 'owned_blobs'; fields[#fields + 1] = job[14] end
  -- The state's other fields (retry_of, ...) override the defaults above.
  for i = 16, #job do fields[#fields + 1] = job[i] end
  if gated then
    fields[#fields + 1] = 'gate'; fields[#fields + 1] = gate
    fields[#fields + 1] = 'gate_ttl_ms'; fields[#fields + 1] = int_text(tonumber(gate_expiry) - now)
  end
  redis.call('HSET', state, unpack(fields))
  emit_known(job_id, 'PENDING', created, name, user, '0', '')
  if gated then
    redis.call('ZADD', gate, gate_expiry, job_id)
    if redis.call('PTTL', gate) < tonumber(gate_expiry) - now then redis.call('PEXPIREAT', gate, gate_expiry) end
  end
  if job[14] ~= '' then redis.call('HSET', C.owned, job_id, job[14]) end
  engine_store(C.queue, engine_key, shared.record(payload, created), ttl_ms, false)
  Q.woken = Q.woken + 1
  tally(Q.counts, Q.count_order, name, 1)
  if user_idx ~= '' then tally(Q.prunes, Q.prune_order, user_idx, 1) end
  if sched_idx ~= '' then tally(Q.prunes, Q.prune_order, sched_idx, 1) end
  return 1
end

-- Sends what the call's jobs share, and ends it.
local function enqueue_end()
  local q, c = Q, C
  Q, C = nil, nil
  batch_end()
  -- Every job's index gains an entry with each enqueue: the count of enqueues paces its pruning.
  for _, name in ipairs(q.count_order) do
    local by = q.counts[name]
    prune(c.all_idx, c.state_prefix, c.cutoff, metric('enq|' .. name, by), by)
  end
  -- A user's (or schedule's) index is pruned with each of its enqueues: paced by the count of all
  -- enqueues of this name, a user who rarely enqueues would keep their expired entries for long.
  for _, index in ipairs(q.prune_order) do prune(index, c.state_prefix, c.cutoff, nil, q.prunes[index]) end
  if q.woken > 0 then engine_wake(c.queue, q.woken) end
end
