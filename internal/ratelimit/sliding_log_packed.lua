-- sliding_log_packed.lua: the sliding-window log of sliding_log.lua, deciding exactly as it does,
-- stored as one string per key instead of a sorted set.
-- (prelude.lua, put before it, holds one decision's clock, arguments and reply.)
--
-- A key holds the admission times still inside its window, ascending, 4 bytes each: big-endian
-- microseconds since the epoch modulo 2^32 (71 minutes). Every time in a key lies within a window
-- of now, and a window is under 2^31 µs (35 minutes; Policy.Validate says so), so the full time
-- is the one nearest now. No request ids: a decision needs only the times, and a withdrawal
-- removes one admission at its time. At limit 10 that is 40 bytes, which Redis stores inline
-- with the key's object (an embstr, up to 44 bytes), where the sorted set keeps a member, a score
-- and their index for each entry.
--
-- A decision is one GET and, when it admits, one SET with the window as TTL: two redis.calls
-- whatever the limit, where the sorted set needs four to seven. The first time inside the window
-- is found by binary search, so a limit of thousands reads a dozen entries, not thousands.

local W, SPAN = 4, 2 ^ 32                                           -- bytes per entry; times are kept modulo SPAN

-- at(s, i) is the i-th time of log s (1-based): its 32 bits, completed to the time nearest now.
local function at(s, i)
  local a, b, c, d = string.byte(s, (i - 1) * W + 1, i * W)
  local x = ((a * 256 + b) * 256 + c) * 256 + d
  return x + SPAN * math.floor((now - x) / SPAN + 0.5)
end

-- pack(t) is time t modulo SPAN as W bytes, most significant first.
local function pack(t)
  local bytes = {}
  t = t % SPAN
  for k = W, 1, -1 do
    bytes[k] = t % 256
    t = math.floor(t / 256)
  end
  return string.char(unpack(bytes))
end

-- after(s, m, since) is the index of the first of the m times of s later than since, or m + 1:
-- times only grow along the log, so a binary search finds it in log2(m) reads.
local function after(s, m, since)
  local lo, hi = 1, m + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if at(s, mid) > since then hi = mid else lo = mid + 1 end
  end
  return lo
end

if undo_at then                                                    -- withdraw: drop one admission made at undo_at
  local removed = 0
  for i = 1, n do
    local s = redis.call('GET', KEYS[i]) or ''
    local m = #s / W
    local k = after(s, m, undo_at - 1)                             -- the first time at or after undo_at
    if k <= m and at(s, k) == undo_at then
      s = string.sub(s, 1, (k - 1) * W) .. string.sub(s, k * W + 1)
      if s == '' then redis.call('DEL', KEYS[i]) else redis.call('SET', KEYS[i], s, 'KEEPTTL') end
      removed = removed + 1
    end                                                            -- else it has left the window: it counts nowhere
  end
  return removed
end

local live, counts = {}, {}
local full = false
for i = 1, n do
  local s = redis.call('GET', KEYS[i]) or ''
  local m = #s / W
  local k = after(s, m, now - windows[i])                          -- times at or before now - window have left it
  live[i] = string.sub(s, (k - 1) * W + 1)                         -- exactly the last window's admissions
  counts[i] = m - k + 1
  if counts[i] >= limits[i] then full = true end                   -- one full key refuses the whole request
end

local remaining, reset = {}, {}
for i = 1, n do
  local log, count, limit, window = live[i], counts[i], limits[i], windows[i]
  if not full and cost > 0 then                                    -- cost 0 only asks (Limiter.AskAll): it records nothing
    local t = now
    if count > 0 then t = math.max(now, at(log, count)) end        -- a clock that steps back never reorders the log
    log, count = log .. pack(t), count + 1                         -- record the admission; a refusal writes nothing
    redis.call('SET', KEYS[i], log, 'PX', window / 1000)           -- the newest entry outlives the rest; so does the key
  end
  -- Room for one more appears when the entry of rank count-limit leaves the window: the oldest,
  -- unless the limit was lowered below what the key already holds.
  local rank = count - limit
  if count == 0 then
    reset[i] = 0
  elseif rank <= 0 then
    reset[i] = at(log, 1) + window - now
  else
    reset[i] = at(log, rank + 1) + window - now
  end
  remaining[i] = math.max(0, limit - count)
end
return reply(not full, remaining, reset)
