-- guard_acquire: admit one request on a guarded connection, by Redis's clock: now, after a paced
-- wait for the slot reserved here, as the one trial of a half-open circuit, or not at all.
-- KEYS: guard state hash, names of the guards in use (zset: name -> last use, epoch ms)
-- ARGV: token, min interval us, trial timeout us, idle ttl ms, name
-- Reply: {0, wait us, slot us} go after the wait; {1, wait us, slot us} the same, as the trial;
--        {-1, retry after us} cooling down; {-2, retry after us} another caller's trial in flight.

local key, token = KEYS[1], ARGV[1]
local interval, trial_timeout, idle_ttl_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_us()
-- Listed even when refused: a connection cooling down is what an operator looks for.
redis.call('ZADD', KEYS[2], math.floor(now / 1000), ARGV[5])
-- The registry goes too once no guard of the namespace has been used for a day.
redis.call('PEXPIRE', KEYS[2], 86400000)
local h = redis.call('HMGET', key, 'open_until_us', 'trial_until_us', 'next_slot_us')
local open_until, trial_until = tonumber(h[1]), tonumber(h[2])
local state = circuit(open_until, now)
if state == OPEN then return {-1, open_until - now} end
-- Half-open admits one caller; the others learn when the trial's reservation lapses at the latest.
if state == HALF_OPEN and trial_until and trial_until > now then return {-2, trial_until - now} end
-- The slot is taken here, in the same script that read the last one: two callers never share it.
local slot = math.max(now, tonumber(h[3]) or 0)
if interval > 0 then redis.call('HSET', key, 'next_slot_us', int(slot + interval)) end
local code = 0
if state == HALF_OPEN then
  -- The reservation expires by itself: a trial whose process dies cannot wedge the circuit.
  redis.call('HSET', key, 'trial', token, 'trial_until_us', int(slot + trial_timeout))
  code = 1
end
if interval > 0 or code == 1 then keep(key, idle_ttl_ms, slot + interval, now) end
return {code, slot - now, slot}
