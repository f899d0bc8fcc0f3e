-- forget.lua: deletes a key (Limiter.Forget), the first of a forgetting's two calls; publish.lua
-- tells the fleet, on ForgetChannel. Two calls, not one: on a cluster the key and the channel live
-- in different slots.
--
-- KEYS[1]  the key
-- reply    1 if it was there, else 0
--
--   redis-cli --eval internal/ratelimit/forget.lua pixlimit:sliding_log:pix:acct-ana
return redis.call('DEL', KEYS[1])
