-- overview_counts: the dashboard overview's counts per job type and status, summed inside Redis (one
-- round trip, where a pipeline of one HGETALL per hour and one HMGET per active job cost tens of ms).
-- Read-only; the hourly counters and states are reached by their key prefixes (store/keys.py).
-- KEYS: active index
-- ARGV: state key prefix, hourly counters key prefix, first hour, last hour, most active jobs to read
-- Reply: {{field, count, ...} of ended jobs, {field, count, ...} of active jobs, active jobs read};
--        a field is '<job name>|<status>'

local ended, active = {}, {}
for hour = tonumber(ARGV[3]), tonumber(ARGV[4]) do
  local h = redis.call('HGETALL', ARGV[2] .. hour)
  for i = 1, #h, 2 do ended[h[i]] = (ended[h[i]] or 0) + tonumber(h[i + 1]) end
end
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[5]) - 1)
for _, id in ipairs(ids) do
  local row = redis.call('HMGET', ARGV[1] .. id, 'name', 'status')
  if row[1] and row[2] then
    local f = row[1] .. '|' .. row[2]
    active[f] = (active[f] or 0) + 1
  end
end
local function flat(t)
  local out = {}
  for k, v in pairs(t) do out[#out + 1] = k; out[#out + 1] = v end
  return out
end
return {flat(ended), flat(active), #ids}
