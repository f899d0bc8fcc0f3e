-- publish.lua: publishes ARGV[1] on the channel KEYS[1], named as a key so that a cluster routes
-- it: a key Forget cleared, on ForgetChannel, and the turns of a queue that moved up when a waiter
-- left (queue.go), on the queue's channel.
--
-- KEYS[1]  the channel
-- ARGV[1]  the message: the forgotten key, or "<key> <turn µs> <moved µs> <at µs> <replica id>"
-- reply    how many subscribers received it
--
--   redis-cli --eval internal/ratelimit/publish.lua pixlimit:queue , 'k 1 2 3 replica-1'
return redis.call('PUBLISH', KEYS[1], ARGV[1])
