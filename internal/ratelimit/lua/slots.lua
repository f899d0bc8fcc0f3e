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

-- holders reads keys[i] once (every redis.call costs a microsecond of bridging, more than the
-- command): how many slots holders other than this request hold (distinct names), whether one of
-- them holds the slot named mine, the first of their leases to end, and this request's own lease
-- end if it holds one. Leases already ended are counted nowhere and dropped (their replicas
-- stopped answering).
local function holders(i, mine)
  local hs = redis.call('ZRANGE', keys[i], 0, -1, 'WITHSCORES')    -- {member, lease end, ...}, soonest end first
  local names, count, shared, first, own, ended = {}, 0, false, nil, nil, false
  for j = 1, #hs, 2 do
    local m, t = hs[j], tonumber(hs[j + 1])
    if t <= now then
      ended = true
    elseif m == id then
      own = t
    else
      first = first or t
      local x = name(m)
      if not names[x] then names[x], count = true, count + 1 end
      shared = shared or x == mine
    end
  end
  if ended then redis.call('ZREMRANGEBYSCORE', keys[i], '-inf', now) end
  return count, shared, first, own
end

---- each decision: what follows runs once per request (what precedes it, once per call)
local allowed, mine = true, name(id)
local counts, shared, firsts, owns = {}, {}, {}, {}
for i = 1, n do
  counts[i], shared[i], firsts[i], owns[i] = holders(i, mine)
  -- every slot held by other requests: refused, unless this request holds one already or shares its name's
  if not undo_at and not shared[i] and not owns[i] and counts[i] >= limits[i] then allowed = false end
end
local remaining, reset = {}, {}
for i = 1, n do
  local own = owns[i]                                              -- this request's lease end after the operation
  if undo_at then
    if own then redis.call('ZREM', keys[i], id) end
    own = nil
  elseif allowed and cost > 0 then
    own = now + windows[i]
    redis.call('ZADD', keys[i], own, id)
    redis.call('PEXPIRE', keys[i], ceil(windows[i] / 1000))
  end
  local count, first = counts[i], firsts[i]
  if own then
    if not shared[i] then count = count + 1 end
    if not first or own < first then first = own end
  end
  remaining[i], reset[i] = max(0, limits[i] - count), first and ceil(first - now) or 0
end
return reply(allowed, remaining, reset)
