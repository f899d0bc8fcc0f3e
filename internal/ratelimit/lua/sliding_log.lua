-- sliding_log.lua: an exact sliding-window log, decided atomically: the whole algorithm.
--
-- Each key is a sorted set with one entry per admitted request: member = the request's id,
-- score = the time it was admitted, in microseconds. A request at time `now` is admitted when
-- every key holds fewer than its limit entries newer than `now - window`; it is then recorded in
-- every key, or, if any key is full, in none: a refused request is never recorded. Redis runs a
-- script alone, so no other decision can interleave between counting and recording: that is what
-- makes the limit exact for every replica that asks the same Redis.
--
-- Every redis.call costs about a microsecond of Lua-to-Redis bridging, more than most of the
-- commands themselves, so the script issues only those the answer needs: it reads the oldest
-- entry first (it is needed for Reset anyway) and prunes only when that entry has left the
-- window. Per key: 4 commands on a new key, 5 on a busy one, 7 when entries have just expired.

---- each decision: what follows runs once per request (what precedes it, once per call)
if undo_at then                                                    -- withdraw: the entry is the request itself, exact
  local removed = 0
  for i = 1, n do
    removed = removed + redis.call('ZREM', keys[i], id)
  end
  return removed
end

local counts, oldest = {}, {}
local full = false
for i = 1, n do
  local key, window = keys[i], windows[i]
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]   -- the oldest entry's time, or nil for an empty key
  if first and tonumber(first) <= now - window then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)       -- slide: drop entries admitted a window ago or earlier
    first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
  end
  local count = 0
  if first then
    count = redis.call('ZCARD', key)                                -- what is left is exactly the last window's admissions
  end
  counts[i], oldest[i] = count, tonumber(first)
  if count >= limits[i] then full = true end                        -- one full key refuses the whole request
end

local remaining, reset = {}, {}
for i = 1, n do
  local key, limit, window, count = keys[i], limits[i], windows[i], counts[i]
  if not full and cost > 0 then                                    -- cost 0 only asks (AskStep): it records nothing
    -- Recorded at now, even if the clock has stepped back behind the newest entry: such an entry
    -- leaves the window up to that step early (TestAClockSteppingBackAdmitsNoMore), and so may
    -- the key, whose TTL counts from now. Recording at the newest entry's time, as the packed
    -- log does, would cost a command per admission.
    count = count + redis.call('ZADD', key, 'NX', now, id)         -- record the admission (ids are unique: adds 1)
    redis.call('PEXPIRE', key, window / 1000)                      -- the newest entry outlives the rest; so does the key, no longer
  end
  -- Room for one more appears when the entry of rank count-limit leaves the window: the oldest,
  -- unless the limit was lowered below what the key already holds.
  local rank = count - limit
  if count == 0 then
    reset[i] = 0                                                   -- an empty key (a refusal by another key recorded nothing here)
  elseif rank <= 0 then
    reset[i] = (oldest[i] or now) + window - now                   -- no oldest before: the entry just recorded is the oldest
  else
    reset[i] = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2] + window - now
  end
  remaining[i] = max(0, limit - count)
end
return reply(not full, remaining, reset)
