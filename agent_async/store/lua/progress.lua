-- progress: record how far a running job is, and announce it on the event stream.
-- KEYS: state
-- ARGV: job id, fraction (0..1), message|'', details JSON|'', now ms
-- Reply: 1 recorded, 0 not running (ended meanwhile, or unknown): nothing written.

local state = KEYS[1]
if redis.call('HGET', state, 'status') ~= 'STARTED' then return 0 end
local job_id, fraction, message, details, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
redis.call('HSET', state, 'progress_fraction', fraction, 'progress_message', message,
           'progress_details', details, 'progress_ms', now)
if EVENTS == '' then return 1 end
local h = redis.call('HMGET', state, 'name', 'user', 'attempts')
redis.call('XADD', EVENTS, 'MAXLEN', '~', EVENTS_KEPT, '*', 'type', 'progress', 'job', job_id, 'status', 'STARTED',
           'name', h[1] or '', 'user', h[2] or '', 'attempts', h[3] or '0', 'fraction', fraction,
           'message', message, 'ms', now)
return 1
