-- sliding_log.lua: an exact sliding-window log over one or more keys, decided atomically.
--
-- Each key is a sorted set with one entry per admitted request: member = the request's id,
-- score = the time it was admitted, in microseconds. A request at time `now` is admitted when
-- every key holds fewer than its limit entries newer than `now - window`; it is then recorded in
-- every key, or, if any key is full, in none. Redis runs a script alone, so no other decision can
-- interleave between counting and recording: that is what makes the limit exact fleet-wide.
--
-- KEYS[i]      the sorted set of the i-th identity (all of them on one node; see doc.go)
-- ARGV[1]      this request's id, unique per request; a retry of the same request reuses it
-- ARGV[2]      now in microseconds, or '' to read the Redis clock (tests inject time; never production)
-- ARGV[3i]     limit of KEYS[i]
-- ARGV[3i+1]   window of KEYS[i] in microseconds (a whole number of milliseconds)
-- ARGV[3i+2]   burst of KEYS[i]: unused here (see token_bucket.lua)
--
-- Returns {allowed, remaining_1, reset_1, remaining_2, reset_2, ..., now}: allowed is 1 or 0 for the
-- whole request; reset_i is the time in microseconds until KEYS[i] has room for one more request
-- (0 when it is empty).
--
-- Every redis.call costs about a microsecond of Lua-to-Redis bridging, more than most of the
-- commands themselves, so the script issues only those the answer needs: it reads the oldest
-- entry first (it is needed for Reset anyway) and prunes only when that entry has left the
-- window. Per key: 4 commands on a new key, 5 on a busy one, 7 when entries have just expired.

local id = ARGV[1]
local now = tonumber(ARGV[2])
if now == nil then
  local t = redis.call('TIME')                                    -- {seconds, microseconds}: the one clock every replica shares
  now = t[1] * 1000000 + t[2]                                      -- < 2^53, so exact in a Lua number
end

local n = #KEYS
local limits, windows, counts, oldest = {}, {}, {}, {}
local full = false
for i = 1, n do
  local key = KEYS[i]
  local limit, window = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]   -- the oldest entry's time, or nil for an empty key
  if first and tonumber(first) <= now - window then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)       -- slide: drop entries admitted a window ago or earlier
    first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
  end
  local count = 0
  if first then
    count = redis.call('ZCARD', key)                                -- what is left is exactly the last window's admissions
  end
  limits[i], windows[i], counts[i], oldest[i] = limit, window, count, tonumber(first)
  if count >= limit then full = true end                            -- one full key refuses the whole request
end

-- A request is recorded in every key or in none, so its id in the first key means this is a retry
-- of a request already admitted (a client that timed out and asked again): admit it again and
-- record nothing. Checked only when a key is full; on the admitting path ZADD NX tells the same.
local allowed = 1
if full and not redis.call('ZSCORE', KEYS[1], id) then
  allowed = 0
end

local out = {allowed}
for i = 1, n do
  local key, limit, window, count = KEYS[i], limits[i], windows[i], counts[i]
  if not full then
    count = count + redis.call('ZADD', key, 'NX', now, id)         -- record the admission (adds 0 if a retry already did)
    redis.call('PEXPIRE', key, window / 1000)                      -- the newest entry outlives the rest; so does the key, no longer
  end
  -- Room for one more appears when the entry of rank count-limit leaves the window: the oldest,
  -- unless the limit was lowered below what the key already holds.
  local reset = 0
  local rank = count - limit
  if count == 0 then
    reset = 0                                                      -- an empty key (a refusal by another key recorded nothing here)
  elseif rank <= 0 then
    reset = (oldest[i] or now) + window - now                      -- no oldest before: the entry just recorded is the oldest
  else
    reset = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2] + window - now
  end
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end
  out[2 * i] = remaining
  out[2 * i + 1] = reset
end
out[#out + 1] = now                                                -- the time decided, for undo.lua
return out
