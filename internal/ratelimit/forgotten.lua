-- forgotten.lua: lists a forgotten key in the fleet's forget list for as long as a deny-cache
-- entry lives, and publishes it on the channel of the same name, so that every replica drops it
-- from its deny cache: at once if it subscribes, else at its next heartbeat (heartbeat.lua).
--
-- KEYS[1]  the forget list, a sorted set of keys scored by when they were forgotten (ms), and the
--          channel of the same name (Limiter.ForgetChannel)
-- ARGV[1]  the forgotten key
-- ARGV[2]  how long it stays listed, ms: the longest a deny-cache entry lives
-- reply    now, in ms of the Redis clock
--
--   redis-cli --eval internal/ratelimit/forgotten.lua pixlimit:forget , pixlimit:sliding_log:pix:acct-ana 60000
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', KEYS[1], ARGV[1])
return now
