-- group_cancel: cancel a group: its waiting children count as canceled (they never start), its
-- queued ones end CANCELED and leave the engine's queue, its running ones are flagged and
-- announced like any running job (their worker stops them). The finalizer still runs, with the
-- counts, once the last child has ended.
-- KEYS: (packed) group, active index, leases
-- ARGV: (packed) now ms, retention s, cancel channel, state key prefix
-- Reply: {status of the group after the call, running children asked to stop}; {''} if unknown.

local group, active, leases = KEYS[1], KEYS[2], KEYS[3]
local now, retention_s, channel, state_prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local status = redis.call('HGET', group, 'status')
if not status then return {''} end
if status ~= 'running' or redis.call('HGET', group, 'cancel_requested_ms') then return {status, 0} end
redis.call('HSET', group, 'cancel_requested_ms', now)
local waiting = redis.call('LLEN', group .. ':waiting')
if waiting > 0 then
  redis.call('DEL', group .. ':waiting')
  redis.call('HINCRBY', group, 'canceled', waiting)
  redis.call('HINCRBY', group, 'ended', waiting)
end
local running = 0
for _, job_id in ipairs(redis.call('SMEMBERS', group .. ':live')) do
  local state = state_prefix .. job_id
  local h = redis.call('HMGET', state, 'status', 'engine_queue', 'engine_key', 'engine_id')
  if h[1] == 'STARTED' then
    redis.call('HSET', state, 'cancel_requested_ms', now)
    redis.call('PUBLISH', channel, job_id)
    running = running + 1
  elseif h[1] and not is_terminal(h[1]) then
    end_job(state, active, leases, job_id, 'CANCELED', now, retention_s, 'canceled with its group before it started')
    engine_drop(h[2] or '', h[3] or '', '', h[4] or '')
  end
end
local ended = tonumber(redis.call('HGET', group, 'ended'))
if ended >= tonumber(redis.call('HGET', group, 'total')) then fire_finalizer(group, active, now, retention_s) end
return {redis.call('HGET', group, 'status'), running}
