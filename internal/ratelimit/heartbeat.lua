-- heartbeat.lua: the fleet's roster, kept by each replica's beat each second: each replica's id
-- scored by when it last beat; those older than the TTL are dropped, and the count of the rest
-- is the fleet's size (the outage fallback's share). No identity is in it. The same call reads the
-- fleet's forget list (forgotten.lua): the keys forgotten since the last beat, which every
-- replica drops from its deny cache.
--
-- KEYS[1]  the roster: a sorted set of replica ids scored by their last beat, ms
-- KEYS[2]  the forget list (forgotten.lua)
-- ARGV[1]  this replica's id
-- ARGV[2]  the TTL, ms: a replica silent for longer is no longer counted
-- ARGV[3]  the Redis clock of the last beat, ms (0 the first time: no news)
-- reply    {fleet size, now in ms, forgotten keys...}
--
--   redis-cli --eval internal/ratelimit/heartbeat.lua pixlimit:{fleet} pixlimit:forget , replica-1 5000 0
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local out = {redis.call('ZCARD', KEYS[1]), now}
if tonumber(ARGV[3]) > 0 then
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[3], '+inf')) do out[#out + 1] = k end
end
return out
