-- forgotten.lua: publishes, on the fleet's channel (ForgetChannel), a key that Cache.Forget
-- cleared, so that every replica's deny cache drops it. The channel is named as a key so that a
-- cluster routes it; the key it names lives in another slot, hence a call apart from the DEL.
--
-- KEYS[1]  the channel
-- ARGV[1]  the forgotten key
-- reply    how many subscribers received it
--
--   redis-cli --eval internal/ratelimit/denycache/forgotten.lua rl:{fleet}:forget , 'rl:pix:{abc}'
return redis.call('PUBLISH', KEYS[1], ARGV[1])
