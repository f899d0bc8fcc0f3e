-- heartbeat.lua: the fleet's roster, kept by each replica's beat each second: each replica's id
-- scored by when it last beat; those older than the TTL are dropped, and the count of the rest
-- is the fleet's size (the outage fallback's share). No identity is in it.
--
-- KEYS[1]  the roster: a sorted set of replica ids scored by their last beat, ms
-- ARGV[1]  this replica's id
-- ARGV[2]  the TTL, ms: a replica silent for longer is no longer counted
-- reply    the fleet's size
--
--   redis-cli --eval internal/ratelimit/fallback/heartbeat.lua pixlimit:{fleet} , replica-1 5000
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
