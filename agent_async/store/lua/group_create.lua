-- group_create: a group, its children and its finalizer, all or nothing. The first max_in_flight
-- children are created and queued; the rest wait, prepared, in the group's waiting list and are
-- released one per ended child (lib.lua's group_child_ended). No child: the finalizer at once.
-- KEYS: (packed) group, active index, pending-finalizer index
-- ARGV: (packed) group id, now ms, retention s, max in flight (0: all), user uid|'', finalizer
--       job id, finalizer spec JSON, resent ('1': this very call was sent before and failed),
--       then one prepared child spec JSON per child
-- Reply: the number of children queued now, or -1 if the group id exists.

local group, active, pending_index = KEYS[1], KEYS[2], KEYS[3]
local group_id, now, retention_s, max_in_flight = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local total = #ARGV - 8
if redis.call('EXISTS', group) == 1 then
  -- A resend finding the group created at its own millisecond: the earlier send ran and its
  -- reply was lost. Answer as it did (the children it queued), writing nothing again.
  if ARGV[8] == '1' and redis.call('HGET', group, 'created_ms') == now then
    if max_in_flight == 0 then return total end
    return math.min(total, max_in_flight)
  end
  return -1
end
redis.call('HSET', group, 'id', group_id, 'status', 'running', 'total', total, 'ended', 0, 'succeeded', 0,
           'failed', 0, 'canceled', 0, 'max_in_flight', max_in_flight, 'user', ARGV[5], 'created_ms', now,
           'final_id', ARGV[6], 'final', ARGV[7], 'pending_index', pending_index)
local queued = 0
for i = 9, #ARGV do
  if max_in_flight == 0 or queued < max_in_flight then
    local spec = cjson.decode(ARGV[i])
    create_prepared(spec, active, now)
    redis.call('SADD', group .. ':live', spec.id)
    queued = queued + 1
  else
    redis.call('RPUSH', group .. ':waiting', ARGV[i])
  end
end
if total == 0 then fire_finalizer(group, active, now, retention_s) end
return queued
