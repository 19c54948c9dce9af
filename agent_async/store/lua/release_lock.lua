-- release_lock: delete a lock only if it still holds the caller's token (compare-and-delete), so
-- a holder whose TTL ran out never frees a lock another process has taken since.
-- KEYS: lock   ARGV: token
-- Reply: 1 released, 0 not ours (or gone).

if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
