-- moved.lua: publishes, on the fleet's queue channel (Channel), the turns of a queue that moved up
-- when one of this replica's waiters left, so that the other replicas move theirs (Queue.leave).
-- The channel is named as a key so that a cluster routes it.
--
-- KEYS[1]  the channel
-- ARGV[1]  "<key> <turn µs> <moved µs> <at µs> <replica id>"
-- reply    how many subscribers received it
--
--   redis-cli --eval internal/ratelimit/queue/moved.lua rl:{fleet}:queue , 'k 1 2 3 replica-1'
return redis.call('PUBLISH', KEYS[1], ARGV[1])
