-- probe.lua: what Ready and the breaker ask of Redis: what a decision needs, a script that writes
-- a key with a TTL. A Redis that answers PING but refuses writes (a read-only replica, one out of
-- memory under noeviction) fails it, as it fails every decision.
--
-- KEYS[1]  the probe's key (Limiter's prefix, ":probe")
-- reply    1
--
--   redis-cli --eval internal/ratelimit/probe.lua pixlimit:probe
redis.call('SET', KEYS[1], '1', 'PX', 1000)
return 1
