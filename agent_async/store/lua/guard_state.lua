-- guard_state: what guarded connections look like now, by Redis's clock; writes nothing.
-- KEYS: one guard state hash per connection asked about
-- ARGV: none
-- Reply: one entry per key: {circuit (0 closed, 1 open, 2 half-open), now us, failures,
--         cooldown until us|nil, trial in flight until us|nil, next slot us|nil, last error class|nil,
--         last error us|nil, 1 if the hash exists else 0}

local now = now_us()
local replies = {}
for i, key in ipairs(KEYS) do
  local h = redis.call('HMGET', key, 'open_until_us', 'trial_until_us', 'next_slot_us', 'failures', 'last_error',
                       'last_error_us')
  local open_until, trial_until = tonumber(h[1]), tonumber(h[2])
  local state = circuit(open_until, now)
  -- A lapsed reservation is no trial: the next caller takes a new one.
  local trial = state == HALF_OPEN and trial_until and trial_until > now and h[2] or false
  replies[i] = {state, now, tonumber(h[4]) or 0, h[1], trial, h[3], h[5], h[6], redis.call('EXISTS', key)}
end
return replies
