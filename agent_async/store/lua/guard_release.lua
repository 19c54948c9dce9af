-- guard_release: record how an admitted request ended, by Redis's clock. A retryable failure counts
-- one and `threshold` in a row open the cooldown; any success resets the count; the trial's verdict
-- closes or reopens the circuit; a request given up before it started frees its trial and hands its
-- slot back if no one has reserved the next.
-- KEYS: guard state hash, metrics hash ('' when metrics are off)
-- ARGV: token, outcome ('ok' | 'fail' | 'drop'), '1' if admitted as the trial, slot us to hand
--       back ('' once the request may have started), min interval us, failure threshold,
--       cooldown us, idle ttl ms, error class name
-- Reply: {circuit after the call (0 closed, 1 open, 2 half-open), failures in a row, 1 if this
--        call opened the circuit else 0}

local key, token, outcome = KEYS[1], ARGV[1], ARGV[2]
local interval, threshold, cooldown = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_us()
local h = redis.call('HMGET', key, 'open_until_us', 'trial', 'failures', 'next_slot_us')
local open_until, failures, next_slot = tonumber(h[1]), tonumber(h[3]) or 0, tonumber(h[4])
local state = circuit(open_until, now)
-- Only the trial still on record has a say: one that lapsed and was replaced is a straggler.
local trial = ARGV[3] == '1' and h[2] == token
if trial then redis.call('HDEL', key, 'trial', 'trial_until_us') end
count_request(KEYS[2], key, outcome)

if outcome == 'drop' then
  local slot = tonumber(ARGV[4])
  if slot and next_slot == slot + interval then redis.call('HSET', key, 'next_slot_us', int(slot)) end
  return {state, failures, 0}
end

local opened = 0
if outcome == 'ok' then
  if failures > 0 then redis.call('HSET', key, 'failures', 0) end
  failures = 0
  if trial then
    redis.call('HDEL', key, 'open_until_us')
    state, open_until = CLOSED, nil
  end
else
  failures = redis.call('HINCRBY', key, 'failures', 1)
  redis.call('HSET', key, 'last_error', ARGV[9], 'last_error_us', int(now))
  -- Stragglers (admitted before the circuit opened) count, but never extend a cooldown.
  if trial or (state == CLOSED and failures >= threshold) then
    open_until = now + cooldown
    redis.call('HSET', key, 'open_until_us', int(open_until))
    state, opened = OPEN, 1
  end
end
keep(key, tonumber(ARGV[8]), math.max(open_until or 0, next_slot or 0), now)
return {state, failures, opened}
