-- slots.lua: in-flight slots, each a lease: at most `limit` requests of one identity in progress
-- at once, fleet-wide (a company's payroll cannot hold every ledger connection). Not a rate
-- limit, but written as the algorithms' bodies are (prelude.lua's locals, its reply), so that a
-- PIX asks and takes its slot in the same call as its limit, and gives it back in the same call
-- as its look-up's refund (sequence.lua).
--
-- keys[i]      the holders: a sorted set of members "<name>:<holder>", scored by when their lease
--              ends, in µs. A slot is a name (a PIX's Idempotency-Key): requests of one name share
--              it, each holding it under a member of its own
-- id           "<name>:<holder>", this request's (Holder)
-- limits[i]    the slots: distinct names
-- windows[i]   the lease, in µs: a slot whose replica died holding it is free again after it
-- cost         1 (decide) takes a slot, or shares the one already of its name (a replay of a
--              request still in progress is never refused: it waits for its original's answer);
--              0 (ask) says whether it would
-- undo_at      set (the operation 'w'): gives this request's hold back; always admitted
--
-- remaining_i is the free slots after the operation; reset_i the time until the first lease
-- ends (a slot frees sooner when its request ends, which nobody can tell in advance).

-- name is a holder's slot: what comes before its last ':'.
local function name(member)
  return string.match(member, '^(.*):[^:]*$') or member
end

-- held counts keys[i]'s slots in use, and says whether one is named mine.
local function held(i, mine)
  local names, count, taken = {}, 0, false
  for _, m in ipairs(redis.call('ZRANGE', keys[i], 0, -1)) do
    local x = name(m)
    if not names[x] then
      names[x], count = true, count + 1
    end
    taken = taken or x == mine
  end
  return count, taken
end

---- each decision: what follows runs once per request (what precedes it, once per call)
local allowed, mine = true, name(id)
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', keys[i], '-inf', now)            -- leases ended: their replicas stopped answering
  if undo_at then
    redis.call('ZREM', keys[i], id)
  else
    local count, shared = held(i, mine)
    if not shared and count >= limits[i] then allowed = false end  -- every slot held by other requests
  end
end
local remaining, reset = {}, {}
for i = 1, n do
  if allowed and not undo_at and cost > 0 then
    redis.call('ZADD', keys[i], now + windows[i], id)
    redis.call('PEXPIRE', keys[i], ceil(windows[i] / 1000))
  end
  remaining[i], reset[i] = max(0, limits[i] - held(i, mine)), 0
  local first = redis.call('ZRANGE', keys[i], 0, 0, 'WITHSCORES')[2]
  if first then reset[i] = ceil(tonumber(first) - now) end
end
return reply(allowed, remaining, reset)
