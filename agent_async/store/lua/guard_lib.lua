-- guard_lib: helpers of the guard scripts (guard_acquire, guard_release, guard_state), loaded in
-- front of each. Every time is microseconds of Redis's own clock (TIME), never a caller's.
-- KEYS: ARGV: none of its own (a library: those of the script it is loaded with).

local CLOSED, OPEN, HALF_OPEN = 0, 1, 2

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Lua 5.1 turns numbers into text with 14 significant digits; epoch microseconds have 16.
local function int(x)
  return string.format('%.0f', x)
end

-- The circuit rule, written once: open while the cooldown runs, half-open once it has run out
-- (until a trial's verdict closes or reopens it), closed when no cooldown is recorded.
local function circuit(open_until, now)
  if not open_until then return CLOSED end
  if now < open_until then return OPEN end
  return HALF_OPEN
end

-- Idle guards expire: the TTL restarts at each use and never ends before a cooldown or a reserved
-- slot does (a long paced queue keeps its pacing).
local function keep(key, idle_ttl_ms, until_us, now)
  local ttl_ms = idle_ttl_ms
  if until_us and until_us > now then ttl_ms = ttl_ms + math.ceil((until_us - now) / 1000) end
  redis.call('PEXPIRE', key, ttl_ms)
end

-- Counts one request outcome in the namespace's metrics hash `metrics` (agent_async.metrics.layout;
-- '' when metrics are off). The connection's name is read off its state key,
-- <namespace>:guard:<name>:state (KeySpace.guard + ':state'; a namespace holds no ':').
local function count_request(metrics, key, result)
  if metrics == '' then return end
  local name = string.match(key, '^[^:]+:guard:(.+):state$')
  if not name then return end
  redis.call('HINCRBY', metrics, 'greq|' .. name .. '|' .. result, 1)
end
