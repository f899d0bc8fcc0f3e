-- slots.lua: in-flight slots, each a lease: at most `limit` requests of one identity in progress
-- at once, fleet-wide (a company's payroll cannot hold every ledger connection). Not a rate
-- limit, but written as the algorithms' bodies are (prelude.lua's locals, its reply), so that a
-- PIX asks and takes its slot in the same call as its limit, and gives it back in the same call
-- as its look-up's refund (sequence.lua).
--
-- keys[i]      the slots: a sorted set of members named by their request (a PIX's
--              Idempotency-Key), scored by when their lease ends, in µs
-- limits[i]    the slots
-- windows[i]   the lease, in µs: a slot whose replica died holding it is free again after it
-- cost         1 (decide) takes a slot named id, or shares the one already named id (a replay of
--              a request still in progress is never refused: it waits for its original's answer);
--              0 (ask) says whether it would
-- undo_at      set (the operation 'w'): gives the slot named id back; always admitted
--
-- remaining_i is the free slots after the operation; reset_i the time until the first lease
-- ends (a slot frees sooner when its request ends, which nobody can tell in advance).

---- each decision: what follows runs once per request (what precedes it, once per call)
local allowed = true
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', keys[i], '-inf', now)            -- leases ended: their replicas stopped answering
  if undo_at then
    redis.call('ZREM', keys[i], id)
  elseif not redis.call('ZSCORE', keys[i], id) and redis.call('ZCARD', keys[i]) >= limits[i] then
    allowed = false                                                -- every slot held by another request
  end
end
local remaining, reset = {}, {}
for i = 1, n do
  if allowed and not undo_at and cost > 0 then
    redis.call('ZADD', keys[i], now + windows[i], id)
    redis.call('PEXPIRE', keys[i], ceil(windows[i] / 1000))
  end
  remaining[i], reset[i] = max(0, limits[i] - redis.call('ZCARD', keys[i])), 0
  local first = redis.call('ZRANGE', keys[i], 0, 0, 'WITHSCORES')[2]
  if first then reset[i] = ceil(tonumber(first) - now) end
end
return reply(allowed, remaining, reset)
