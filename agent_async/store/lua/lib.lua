-- Helpers shared by every store script; loaded in front of each of them, after the engine's
-- library. @NAME@ placeholders are filled in from agent_async.lifecycle when the file is loaded.
--
-- Redis's costs that shape this code (Redis 7.0, measured with callgrind: docs/performance.md):
-- a number passed to redis.call is turned into text with printf("%.17g"), and so is a number
-- concatenated into a string, each about as costly as a small command: times travel as the text
-- they arrived as (a script's ARGV), and a number is made text once per call (int_text). Each
-- field HMGET asks for costs about as much as a small command (its reply, then its conversion to
-- Lua), there or not: reads ask for what the common path needs. Every table a reply becomes, and
-- every table a script builds, costs an allocation and a little garbage collection.

local TERMINAL_SET = {@TERMINAL_SET@}
local WORKER_LOST = '@WORKER_LOST@'
local PRUNE_BATCH = @PRUNE_BATCH@
local PRUNE_EVERY = @PRUNE_EVERY@
local EVENTS = '@EVENTS@'
local EVENTS_KEPT = @EVENTS_KEPT@
local EVENTS_PER_ENTRY = @EVENTS_PER_ENTRY@
local METRICS = '@METRICS@'
-- Histogram bucket bounds in ms, ascending (agent_async.metrics.layout.BUCKETS_S), and the same
-- as the text of their fields.
local BUCKETS_MS = {@BUCKETS_MS@}
local BUCKET_NAMES = {@BUCKET_NAMES@}

-- A whole number as text, formatted once per script call for each value (see above).
local INT_TEXT = {}
local function int_text(n)
  local text = INT_TEXT[n]
  if not text then
    text = string.format('%d', n)
    INT_TEXT[n] = text
  end
  return text
end

-- A script that moves many jobs at once (the fast worker's claim and its finishes) shares the
-- writes its jobs make to the same keys: the index entries each start or end adds and drops,
-- and the counters. Between batch_begin() and batch_end() they are collected, then sent as one
-- variadic call per key (the counters: add_counts): each call in a script costs Redis a
-- microsecond or more whatever its work, and a batch of ten finishes made some sixty of them.
-- Outside a batch every write goes at once. Removals go before additions at the end: a job ended
-- and started again in one batch (a retry claimed at once) stays in the index.
-- A batch begun inside another (the claim a finish carries) joins it: the outer one sends.
-- Its events go out the same way: one stream entry for up to EVENTS_PER_ENTRY of them (emit_known).
local B, B_DEPTH = nil, 0
local VARIADIC_MAX = 1000  -- arguments per variadic call (Lua's unpack has a limit)

local function batch_begin()
  B_DEPTH = B_DEPTH + 1
  if B_DEPTH > 1 then return end
  B = {zrem = {}, zadd = {}, incr = {}, incr_order = {}, ends = {}, ends_order = {}, end_args = {}, events = {}}
end

local function later(t, key)
  local list = t[key]
  if not list then list = {}; t[key] = list end
  return list
end

local function zadd_later(key, score, member)
  if not B then redis.call('ZADD', key, score, member); return end
  local list = later(B.zadd, key)
  list[#list + 1] = score
  list[#list + 1] = member
end

local function zrem_later(key, member)
  if not B then redis.call('ZREM', key, member); return end
  local list = later(B.zrem, key)
  list[#list + 1] = member
end

-- One command over many arguments, VARIADIC_MAX at a time, after `key` (nil: none, as for DEL).
-- VARIADIC_MAX is even: a ZADD's chunks keep whole score/member pairs.
local function variadic(command, key, args)
  for first = 1, #args, VARIADIC_MAX do
    local last = math.min(#args, first + VARIADIC_MAX - 1)
    if key then redis.call(command, key, unpack(args, first, last)) else redis.call(command, unpack(args, first, last)) end
  end
end

-- A batch's running sum for `key` in `map`, `by` more; `order` keeps the keys as first seen.
-- Returns the new sum.
local function tally(map, order, key, by)
  local sum = map[key]
  if not sum then order[#order + 1] = key; sum = 0 end
  sum = sum + by
  map[key] = sum
  return sum
end

-- The text of an error a pcall caught (a Redis error is a table with `err`).
local function error_text(err)
  return type(err) == 'table' and (err.err or 'error') or tostring(err)
end

-- Counters live in the namespace's metrics hash, written by the script that makes the transition:
-- atomic with it, summed over every worker process and host, kept when a worker is SIGKILLed.
-- Field names: agent_async.metrics.layout.
-- Returns the counter's new value (nil when metrics are off, and inside a batch).
local function metric(field, by)
  if METRICS == '' then return nil end  -- metrics are off (AGENT_METRICS_ENABLED=false)
  if B then
    tally(B.incr, B.incr_order, field, by or 1)
    return nil
  end
  return redis.call('HINCRBY', METRICS, field, by or 1)
end

-- One observation: its bucket's own count (not cumulative: the collector sums them) and the sum in ms.
local function observe(kind, name, ms)
  if METRICS == '' or not ms then return end
  if ms < 0 then ms = 0 end
  local bound = 'inf'
  for i = 1, #BUCKETS_MS do
    if ms <= BUCKETS_MS[i] then bound = BUCKET_NAMES[i]; break end
  end
  metric(kind .. '_b|' .. name .. '|' .. bound)
  metric(kind .. '_sum|' .. name, math.floor(ms))
end

-- The value of `name` in a flat field/value list (a state's fields as the scripts receive them).
local function field_value(list, first, name)
  for i = first, #list - 1, 2 do
    if list[i] == name then return list[i + 1] end
  end
  return ''
end

-- One event per transition, in the same script as the transition: no event without a
-- transition, no transition without an event. Its stream id (ms-seq) orders and resumes a reader.
-- An entry holds one event (its fields) or, for a batch's, up to EVENTS_PER_ENTRY of them as one
-- JSON list of [job, status, name, user, attempts, error, ms] (type 'batch'; the k-th is event
-- ms-seq.k to a reader, store/events.py): each XADD costs Redis some 4 µs over its work, the JSON
-- about 1 per event, and a claim or a finish of ten jobs made ten of them. (An event built as
-- JSON text in Lua instead of a table cjson encodes at the end cost Redis more: every string
-- Lua makes is hashed and interned.)
local function xadd_event(e)
  redis.call('XADD', EVENTS, 'MAXLEN', '~', EVENTS_KEPT, '*', 'type', 'status', 'job', e[1], 'status', e[2],
             'name', e[3], 'user', e[4], 'attempts', e[5], 'error', e[6], 'ms', e[7])
end

local function send_events(events)
  local n = #events
  for first = 1, n, EVENTS_PER_ENTRY do
    local last = math.min(n, first + EVENTS_PER_ENTRY - 1)
    if last == first then
      xadd_event(events[first])
    else
      redis.call('XADD', EVENTS, 'MAXLEN', '~', EVENTS_KEPT, '*', 'type', 'batch',
                 'events', cjson.encode({unpack(events, first, last)}))
    end
  end
end

-- emit_known: for a script that already holds the state's fields as they now are (no read).
-- `attempts` and `now` as text (a number is formatted here).
local function emit_known(job_id, status, now, name, user, attempts, err)
  if EVENTS == '' then return end  -- events are off (AGENT_EVENTS_ENABLED=false)
  if attempts == nil or attempts == '' then attempts = '0' end
  if type(attempts) == 'number' then attempts = int_text(attempts) end
  if type(now) == 'number' then now = int_text(now) end
  local e = {job_id, status, name or '', user or '', attempts, err or '', now}
  if B then B.events[#B.events + 1] = e else xadd_event(e) end
end

local function emit(state, job_id, status, now)
  if EVENTS == '' then return end
  local h = redis.call('HMGET', state, 'name', 'user', 'attempts', 'error')
  emit_known(job_id, status, now, h[1], h[2], h[3], h[4])
end

local function is_terminal(status)
  return TERMINAL_SET[status] ~= nil
end

-- The resume rule (agent_async.lifecycle.may_resume): an attempt cut short may run again.
local function may_resume(resume, attempts, max_try)
  return resume == '1' and tonumber(attempts or '0') < tonumber(max_try or '1')
end

-- How many of the counts 1..n start a run of PRUNE_EVERY (1, 1 + PRUNE_EVERY, ...).
local function prune_turns(n) return math.floor((n + PRUNE_EVERY - 1) / PRUNE_EVERY) end

-- Index entries older than the retention are checked (and dropped if their state expired) a few
-- at a time, so indexes stay bounded without a full scan on any single call. An index written by
-- every job is pruned on every PRUNE_EVERY-th write only, PRUNE_EVERY times as many at once
-- (`count`, one the script already holds, says it is that write): the same bound, and one
-- ZRANGEBYSCORE per PRUNE_EVERY jobs instead of one per job (each call in a script costs Redis
-- a few microseconds, whatever it finds).
-- `by`: how many writes of the index this prune answers for (a batch counts several at once;
-- default 1), `count` the paced count after them: the index is pruned for each run they started.
local function prune(index, state_prefix, cutoff_ms, count, by)
  if index == '' then return end
  by = by or 1
  local batch = PRUNE_BATCH * by
  if count then
    local turns = prune_turns(count) - prune_turns(count - by)
    if turns == 0 then return end
    batch = PRUNE_BATCH * PRUNE_EVERY * turns
  end
  local old = redis.call('ZRANGEBYSCORE', index, '-inf', cutoff_ms, 'LIMIT', 0, batch)
  for _, member in ipairs(old) do
    if redis.call('EXISTS', state_prefix .. member) == 0 then redis.call('ZREM', index, member) end
  end
end

-- The dashboard's indexes (store/keys.py name_index, status_index, ended_counts) sit beside the
-- active index, <ns>:idx:active, so no script needs another key argument to reach them.
local function idx_key(active, suffix) return string.sub(active, 1, -7) .. suffix end

local function zset_or_none(key)
  if key == '' then return true end
  local t = redis.call('TYPE', key)['ok']
  return t == 'zset' or t == 'none'
end

-- A job prepared by Python (store/groups.py) and created here: a group's child released by the
-- sliding window, or its finalizer. spec: {id, state, fields = {field, value, ...}, user_idx,
-- all_idx, queue, job_key, engine_id, bytes, ttl_ms}.
local function create_prepared(spec, active, now)
  redis.call('HSET', spec.state, unpack(spec.fields))
  redis.call('HSET', spec.state, 'updated_ms', now)
  emit(spec.state, spec.id, 'PENDING', now)
  metric('enq|' .. field_value(spec.fields, 1, 'name'))
  redis.call('ZADD', active, now, spec.id)
  redis.call('ZADD', spec.all_idx, now, spec.id)
  redis.call('ZADD', idx_key(active, 'name:' .. redis.call('HGET', spec.state, 'name')), now, spec.id)
  if spec.user_idx ~= '' then redis.call('ZADD', spec.user_idx, now, spec.id) end
  engine_queue(spec.queue, spec.job_key, spec.engine_id, spec.bytes, now, spec.ttl_ms)
end

local function group_keys(group)
  return {group, group .. ':ended', group .. ':live', group .. ':waiting', group .. ':failed'}
end

-- The finalizer, queued inside the script that ended the last child: no second round trip, no
-- polling. If queueing it fails (a corrupted key), the group is marked so that the recovery pass
-- queues it later (group_finalize.lua) instead of losing it.
local function try_finalize(group, active, now, retention_s)
  local ok = pcall(create_prepared, cjson.decode(redis.call('HGET', group, 'final')), active, now)
  if not ok then
    redis.call('HSET', group, 'status', 'final_pending')
    redis.call('ZADD', redis.call('HGET', group, 'pending_index'), now, redis.call('HGET', group, 'id'))
    return false
  end
  redis.call('HSET', group, 'status', 'finalized', 'finalized_ms', now)
  -- Counted once, when the finalizer is queued (here or later by the recovery pass).
  local c = redis.call('HMGET', group, 'cancel_requested_ms', 'failed', 'canceled')
  local outcome = 'succeeded'
  if c[1] then outcome = 'canceled'
  elseif tonumber(c[2] or '0') > 0 then outcome = 'failed'
  elseif tonumber(c[3] or '0') > 0 then outcome = 'canceled' end
  metric('grp|' .. outcome)
  redis.call('ZREM', redis.call('HGET', group, 'pending_index'), redis.call('HGET', group, 'id'))
  for _, key in ipairs(group_keys(group)) do redis.call('EXPIRE', key, retention_s) end
  return true
end

local function fire_finalizer(group, active, now, retention_s)
  -- Exactly once: only the first caller to set fired_ms queues it.
  if redis.call('HSETNX', group, 'fired_ms', now) == 0 then return end
  try_finalize(group, active, now, retention_s)
end

-- A child of a group reached a terminal state: count it once by its id (however often it was
-- retried or redelivered), release the next waiting child, and fire the finalizer after the last.
local function group_child_ended(group, job_id, status, now, active, retention_s)
  if redis.call('SADD', group .. ':ended', job_id) == 0 then return end
  redis.call('SREM', group .. ':live', job_id)
  local counter = 'failed'
  if status == 'SUCCESS' then counter = 'succeeded' elseif status == 'CANCELED' then counter = 'canceled' end
  redis.call('HINCRBY', group, counter, 1)
  if counter == 'failed' then redis.call('RPUSH', group .. ':failed', job_id) end
  local ended = redis.call('HINCRBY', group, 'ended', 1)
  if not redis.call('HGET', group, 'cancel_requested_ms') then
    local waiting = redis.call('LPOP', group .. ':waiting')
    if waiting then
      local spec = cjson.decode(waiting)
      create_prepared(spec, active, now)
      redis.call('SADD', group .. ':live', spec.id)
    end
  end
  if ended >= tonumber(redis.call('HGET', group, 'total')) then fire_finalizer(group, active, now, retention_s) end
end

-- The fields end_job reads, in its order; a script that read them already passes them (`known`).
local END_FIELDS = {'gate', 'group', 'name', 'status', 'started_ms', 'user', 'attempts', 'error'}
-- transition_job's reply for a move whose attempt is over.
local STALE = -1

-- `by` more ends of one job name and status in the hour's counts (the dashboard's throughput).
-- The hour's hash gets its expiry with its first count of each kind (not at every count); the
-- status and name indexes gain an entry with each of those ends: that count paces their pruning.
local function count_ends(active, name, status, by, now, retention_s, prefix)
  local counts = idx_key(active, 'counts:' .. math.floor(now / 3600000))
  local ended = redis.call('HINCRBY', counts, name .. '|' .. status, by)
  if ended == by then redis.call('EXPIRE', counts, retention_s + 3600) end
  local cutoff = now - retention_s * 1000
  prune(idx_key(active, 'status:' .. status), prefix, cutoff, ended, by)
  prune(idx_key(active, 'name:' .. name), prefix, cutoff, ended, by)
end

-- A batch's counters, `sums` by field. One field is one HINCRBY; more are read in one call and
-- written in one (nothing moves them in between: the script is atomic) instead of a call per
-- field, about five for a batch of finishes and the claim it carries.
local function add_counts(fields, sums)
  if #fields == 1 then redis.call('HINCRBY', METRICS, fields[1], sums[fields[1]]); return end
  local now = redis.call('HMGET', METRICS, unpack(fields))
  local args = {}
  for i, field in ipairs(fields) do
    args[#args + 1] = field
    args[#args + 1] = string.format('%d', (tonumber(now[i]) or 0) + sums[field])
  end
  variadic('HSET', METRICS, args)
end

-- Sends what the batch collected (see batch_begin) and ends it.
local function batch_end()
  B_DEPTH = B_DEPTH - 1
  if B_DEPTH > 0 then return end
  local b = B
  B = nil
  for key, members in pairs(b.zrem) do variadic('ZREM', key, members) end
  for key, scored in pairs(b.zadd) do variadic('ZADD', key, scored) end
  if #b.incr_order > 0 then add_counts(b.incr_order, b.incr) end
  for _, kind in ipairs(b.ends_order) do
    local a = b.end_args[kind]
    count_ends(a[1], a[2], a[3], b.ends[kind], a[4], a[5], a[6])
  end
  send_events(b.events)
end

-- Ends a state for good: terminal fields, out of the active index and the leases, slot freed,
-- retention TTL, its group told. Every script that can end a job ends it through here.
local function end_job(state, active, leases, job_id, status, now, retention_s, err, result, known)
  -- Read before the status is overwritten: whether it was running, and since when; and what the
  -- event carries (nothing below changes the name, user or attempts).
  local h = known or redis.call('HMGET', state, unpack(END_FIELDS))
  if type(now) == 'number' then now = int_text(now) end
  local fields = {'status', status, 'updated_ms', now, 'finished_ms', now}
  if err and err ~= '' then fields[#fields + 1] = 'error'; fields[#fields + 1] = err; h[8] = err end
  if result and result ~= '' then fields[#fields + 1] = 'result'; fields[#fields + 1] = result end
  redis.call('HSET', state, unpack(fields))
  zrem_later(active, job_id)
  zrem_later(leases, job_id)
  if h[1] then zrem_later(h[1], job_id) end
  redis.call('EXPIRE', state, retention_s)
  local name = h[3] or ''
  zadd_later(idx_key(active, 'status:' .. status), now, job_id)
  if B then
    local kind = name .. '|' .. status
    if tally(B.ends, B.ends_order, kind, 1) == 1 then
      B.end_args[kind] = {active, name, status, now, retention_s, string.sub(state, 1, -#job_id - 1)}
    end
  else
    count_ends(active, name, status, 1, now, retention_s, string.sub(state, 1, -#job_id - 1))
  end
  emit_known(job_id, status, now, name, h[6], h[7], h[8])
  metric('fin|' .. name .. '|' .. status)
  if h[4] == 'STARTED' then
    -- The run that ended the job (its count also ends the run in jobs_in_progress); an undone
    -- start has no run time: it is told apart.
    if h[5] then observe('dur', name, tonumber(now) - tonumber(h[5])) else metric('run_adj|' .. name) end
  end
  if h[2] then group_child_ended(h[2], job_id, status, now, active, retention_s) end
end

local function lost_error(lost, resume)
  return WORKER_LOST .. ': ' .. lost .. (resume == '1' and ' (no attempts left)' or ' (resume is off)')
end

-- PENDING/RETRY -> STARTED (start.lua; the fast worker's claim calls it for each job it claims).
-- `now` and `lease_expiry`: ms, as text (or numbers). Returns what start.lua replies, as values:
-- attempts, user, name when the job may run; -1 (no state); -2, status; -3, status.
-- It reads what every start needs; a gated job's slot expiry and a redelivery's fields are read
-- only for those (each field read costs about as much as a small command).
local function start_job(state, active, leases, job_id, now, lease_expiry, retention_s, resent)
  local h = redis.call('HMGET', state, 'status', 'user', 'name', 'gate', 'attempts', 'updated_ms', 'error')
  local status, user, name = h[1], h[2] or '', h[3]
  if not status then return -1 end
  if TERMINAL_SET[status] then return -2, status end
  if type(now) == 'number' then now = int_text(now) end
  if type(lease_expiry) == 'number' then lease_expiry = int_text(lease_expiry) end
  if status == 'STARTED' then
    local r = redis.call('HMGET', state, 'started_ms', 'cancel_requested_ms', 'resume', 'max_try')
    if resent and tonumber(r[1]) == tonumber(now) then
      -- This very start, sent again because its reply was lost (the connection dropped after Redis
      -- ran it): it started, so it is not a redelivery. No other pickup of the job can have started
      -- it in the same millisecond, since the engine's in-progress key keeps the job to this one.
      redis.call('ZADD', leases, lease_expiry, job_id)
      return tonumber(h[5]), user, name
    end
    -- The engine redelivered a run that never finished: its worker was lost.
    if r[2] then
      end_job(state, active, leases, job_id, 'CANCELED', now, retention_s, 'canceled: its worker was lost while it ran')
      metric('rec|' .. (name or '') .. '|canceled')
      return -3, 'CANCELED'
    end
    if not may_resume(r[3], h[5], r[4]) then
      end_job(state, active, leases, job_id, 'FAILURE', now, retention_s,
              lost_error('the worker was lost during attempt ' .. h[5], r[3]))
      metric('rec|' .. (name or '') .. '|failed')
      return -3, 'FAILURE'
    end
    metric('rec|' .. (name or '') .. '|resumed')
  else
    -- From the queue: how long it waited since it was queued (its count is also a run started).
    observe('wait', name or '', tonumber(now) - tonumber(h[6] or now))
  end
  local attempts = tonumber(h[5] or '0') + 1
  local attempts_text = int_text(attempts)
  redis.call('HSET', state, 'status', 'STARTED', 'started_ms', now, 'updated_ms', now, 'attempts', attempts_text)
  emit_known(job_id, 'STARTED', now, name, user, attempts_text, h[7])
  zadd_later(active, now, job_id)
  zadd_later(leases, lease_expiry, job_id)
  local gate = h[4]
  if gate then
    -- The slot's safety-net TTL counts from the start of the run, not from the enqueue.
    local ttl_ms = tonumber(redis.call('HGET', state, 'gate_ttl_ms'))
    local expiry = tonumber(now) + ttl_ms
    if redis.call('ZADD', gate, 'XX', 'CH', expiry, job_id) == 1 and redis.call('PTTL', gate) < ttl_ms then
      redis.call('PEXPIREAT', gate, expiry)
    end
  end
  return attempts, user, name
end

-- Moves a non-terminal state to a new status (transition.lua; the fast worker's finish_batch.lua
-- for each run it finishes); a terminal state is never overwritten. `undo`: the start never ran
-- (marked STARTED by a pickup, then dropped by the engine). `attempt` (0: any): the attempt whose
-- run this ends; a move to a status that is not an end (a retry, a hand-back) happens only while
-- that attempt runs. Returns 1 if it moved, 0 if the state is terminal or gone, -1 if that attempt
-- is over (STALE).
local function transition_job(state, active, leases, job_id, new_status, now, retention_s, result, err, undo, attempt)
  -- end_job's read, done here: one HMGET for both (kept in step with the changes below).
  local h = redis.call('HMGET', state, unpack(END_FIELDS))
  local current = h[4]
  if not current or is_terminal(current) then return 0 end
  if attempt > 0 and not is_terminal(new_status) and (current ~= 'STARTED' or tonumber(h[7]) ~= attempt) then
    -- Sent again after its reply was lost, the first send having queued the job again (or
    -- recovery having done so): it must not move the job back, nor the next attempt's run.
    return STALE
  end
  if err == '' and h[8] then redis.call('HDEL', state, 'error'); h[8] = false end
  if undo and current == 'STARTED' then
    h[7] = redis.call('HINCRBY', state, 'attempts', -1)
    redis.call('HDEL', state, 'started_ms')
    h[5] = false
  end
  if is_terminal(new_status) then
    end_job(state, active, leases, job_id, new_status, now, retention_s, err, result, h)
    return 1
  end
  local fields = {'status', new_status, 'updated_ms', now}
  if result ~= '' then fields[#fields + 1] = 'result'; fields[#fields + 1] = result end
  if err ~= '' then fields[#fields + 1] = 'error'; fields[#fields + 1] = err end
  redis.call('HSET', state, unpack(fields))
  emit_known(job_id, new_status, now, h[3], h[6], h[7], err)  -- its error is err now, or none
  -- jobs_in_progress is derived (agent_async.metrics.layout.Field.IN_PROGRESS_ADJUST): a retry
  -- ends a run; any other way out of STARTED, or into it, is an adjustment (rare paths only).
  local name, left = h[3] or '', current == 'STARTED' and new_status ~= 'STARTED'
  if new_status == 'RETRY' then
    metric('retry|' .. name)
    if not left then metric('run_adj|' .. name, -1) end
  elseif left then
    metric('run_adj|' .. name)
  end
  if current ~= 'STARTED' and new_status == 'STARTED' then metric('run_adj|' .. name, -1) end
  zadd_later(active, now, job_id)
  if new_status ~= 'STARTED' then zrem_later(leases, job_id) end
  return 1
end
