-- forget.lua: deletes a key (Limiter.Forget). A deny cache then tells the fleet's caches
-- (package denycache's forgotten.lua).
--
-- KEYS[1]  the key
-- reply    1 if it was there, else 0
--
--   redis-cli --eval internal/ratelimit/forget.lua pixlimit:sliding_log:pix:acct-ana
return redis.call('DEL', KEYS[1])
